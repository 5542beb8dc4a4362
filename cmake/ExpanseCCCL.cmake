# expanse_cccl_headers: an INTERFACE target with the include directories that Thrust and libcu++
# (cuda::mr) need when compiled by a host compiler (nvcc finds them by itself). CUDA 13 ships CCCL
# under <CUDA>/include/cccl; CUDA 12 under <CUDA>/include. cuda::stream_ref also needs
# <CUDA>/include (cuda_runtime_api.h). Headers only: nothing links libcudart or libcuda.
#
# Sets EXPANSE_CCCL_FOUND and EXPANSE_CCCL_VERSION (e.g. 3000001 for CCCL 3.0.1).
include_guard(GLOBAL)

if(NOT CUDAToolkit_FOUND)
  find_package(CUDAToolkit QUIET)
endif()

find_path(EXPANSE_CCCL_INCLUDE_DIR thrust/version.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS}/cccl ${CUDAToolkit_INCLUDE_DIRS}
          DOC "Directory holding thrust/, cub/ and cuda/ (CCCL)")

set(EXPANSE_CCCL_FOUND OFF)
set(EXPANSE_CCCL_VERSION "")
if(EXPANSE_CCCL_INCLUDE_DIR AND EXISTS "${EXPANSE_CCCL_INCLUDE_DIR}/cuda/std/__cccl/version.h")
  file(STRINGS "${EXPANSE_CCCL_INCLUDE_DIR}/cuda/std/__cccl/version.h" _expanse_cccl_line
       REGEX "^#define CCCL_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CCCL_VERSION ([0-9]+).*" "\\1" EXPANSE_CCCL_VERSION
                       "${_expanse_cccl_line}")
  set(EXPANSE_CCCL_FOUND ON)
endif()

if(EXPANSE_CCCL_FOUND AND NOT TARGET expanse_cccl_headers)
  add_library(expanse_cccl_headers INTERFACE)
  target_include_directories(expanse_cccl_headers SYSTEM INTERFACE
                             ${EXPANSE_CCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  message(STATUS "expanse: CCCL ${EXPANSE_CCCL_VERSION} headers from ${EXPANSE_CCCL_INCLUDE_DIR}")
elseif(NOT EXPANSE_CCCL_FOUND)
  message(STATUS "expanse: CCCL (Thrust/libcu++) headers not found; Thrust and cuda::mr tests "
                 "and examples are not built")
endif()
