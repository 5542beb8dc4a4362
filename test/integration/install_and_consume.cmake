# cmake -P script behind the ctest Integration.InstallAndConsume:
#   1. cmake --install BUILD_DIR --prefix WORK_DIR/prefix
#   2. checks the installed files (headers, libexpanse.so, expanseConfig.cmake, expanse.pc, CLI)
#   3. configures and builds CONSUMER_SOURCE_DIR (find_package(expanse) only) against the prefix
#   4. runs the consumer (EXPANSE_CONF from the test's environment: the sim)
#   5. pkg-config --cflags --libs expanse, and a one-file build with those flags (if PKG_CONFIG)
foreach(var BUILD_DIR WORK_DIR CONSUMER_SOURCE_DIR GENERATOR CXX_COMPILER LIBDIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_and_consume.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${ARGN}\n--- stdout\n${out}\n--- stderr\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# 1. install
run_step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

# 2. what the package must hold
set(expected
  include/expanse/expanse.h include/expanse/expanse.hpp include/expanse/errors.hpp
  include/expanse/thrust.hpp include/expanse/memory_resource.hpp
  ${LIBDIR}/libexpanse.so
  ${LIBDIR}/cmake/expanse/expanseConfig.cmake
  ${LIBDIR}/cmake/expanse/expanseConfigVersion.cmake
  ${LIBDIR}/cmake/expanse/expanseTargets.cmake
  ${LIBDIR}/pkgconfig/expanse.pc)
if(EXPECT_CLI)
  list(APPEND expected bin/expanse)
endif()
foreach(f IN LISTS expected)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "the installed package lacks ${f} (prefix ${prefix})")
  endif()
endforeach()
file(GLOB_RECURSE internal RELATIVE "${prefix}" "${prefix}/*gtest*" "${prefix}/*_tests")
if(internal)
  message(FATAL_ERROR "test files were installed: ${internal}")
endif()
message(STATUS "installed files: ok")

# 3. an out-of-tree project that knows only find_package(expanse)
set(compilers -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
separate_arguments(extra_flags UNIX_COMMAND "${EXTRA_FLAGS}")  # sanitizer builds
if(EXTRA_FLAGS)
  list(APPEND compilers "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
endif()
if(C_COMPILER)
  list(APPEND compilers -DCMAKE_C_COMPILER=${C_COMPILER})
endif()
run_step("configure the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
         -G "${GENERATOR}" ${compilers} -DCMAKE_BUILD_TYPE=Release
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
run_step("build the consumer" ${CMAKE_COMMAND} --build "${consumer_build}")

# 4. run it; it must have linked the installed library, not the build tree's
run_step("run the consumer" "${consumer_build}/expanse_consumer")
message(STATUS "consumer says: ${step_output}")
if(NOT step_output MATCHES "expanse_consumer: ok")
  message(FATAL_ERROR "the consumer did not report success:\n${step_output}")
endif()
file(REAL_PATH "${prefix}/${LIBDIR}" real_libdir)
if(NOT step_output MATCHES "library: ${real_libdir}/libexpanse" AND
   NOT step_output MATCHES "library: ${prefix}/${LIBDIR}/libexpanse")
  message(FATAL_ERROR "the consumer did not load libexpanse from ${prefix}/${LIBDIR}:\n${step_output}")
endif()
if(EXPECT_CLI)
  run_step("installed CLI runs" "${prefix}/bin/expanse" info)
endif()

# 5. pkg-config
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
  run_step("pkg-config --cflags --libs expanse" "${PKG_CONFIG}" --cflags --libs expanse)
  string(STRIP "${step_output}" flags)
  message(STATUS "pkg-config flags: ${flags}")
  # The .pc file is relocatable (prefix from ${pcfiledir}), so paths may read <prefix>/lib/pkgconfig/../..
  if(NOT flags MATCHES "-I[^ ]*include" OR NOT flags MATCHES "-lexpanse")
    message(FATAL_ERROR "unexpected pkg-config flags: ${flags}")
  endif()
  separate_arguments(flag_list UNIX_COMMAND "${flags}")
  run_step("build with pkg-config flags" "${CXX_COMPILER}" -std=c++17 ${extra_flags}
           "${CONSUMER_SOURCE_DIR}/main.cpp" ${flag_list}
           "-Wl,-rpath,${prefix}/${LIBDIR}" -ldl -o "${WORK_DIR}/consumer_pkgconfig")
  run_step("run the pkg-config build" "${WORK_DIR}/consumer_pkgconfig")
else()
  message(STATUS "pkg-config not found: the .pc file was installed but not checked")
endif()
