# pip install ./python into a fresh --target folder with no package index, then import it.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${PYTHON} -m pip install --no-index --target ${WORK}/site ${SRC}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install ${SRC} failed:\n${out}\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${WORK}/site
                ${PYTHON} -c "import expanse, expanse.torch; print(expanse.__file__, expanse.driver_description())"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "${WORK}/site/expanse/__init__.py sim:")
  message(FATAL_ERROR "the pip-installed package did not import from ${WORK}/site:\n${out}\n${err}")
endif()
message(STATUS "${out}")
