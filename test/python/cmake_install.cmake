# cmake --install of the runtime and python components into a fresh prefix; the installed
# package must find the installed libexpanse.so.0 by itself (EXPANSE_LIBRARY unset).
if(PYDIR STREQUAL "")
  message(FATAL_ERROR "PYDIR is empty: EXPANSE_PYTHON_INSTALL_DIR was not set when test/python "
                      "was configured")
endif()
file(REMOVE_RECURSE ${WORK})
foreach(component runtime python)
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}
                          --component ${component}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install --component ${component} failed:\n${out}\n${err}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=EXPANSE_LIBRARY
                        PYTHONPATH=${WORK}/${PYDIR}
                        ${PYTHON} -c "import expanse; print(expanse.library_path())"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^${WORK}/")
  message(FATAL_ERROR "the installed package did not load the installed library:\n${out}\n${err}")
endif()
message(STATUS "${out}")
