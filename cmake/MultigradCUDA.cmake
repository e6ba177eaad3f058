# Decides whether this build has a CUDA backend, and if so enables the CUDA language.
#
# In: MG_CUDA (AUTO|ON|OFF|EMULATE|PTX), MG_CUDA_ARCHS.
# Out: MG_HAS_CUDA, MG_CUDA_EMULATE, MG_CUDA_PTX_CHECK, CUDAToolkit_* and CUDA::* targets.
#
# PTX: nvcc is found and checked as for ON and the CUDA language enabled, but the library is the
# CPU build (MG_HAS_CUDA off); CMakeLists.txt compiles every kernel to PTX as a check. For a
# machine with the toolkit and no GPU (scripts/common.sh picks it there), where CUDA code can be
# compiled but never run; build-emu/ compiles and runs the same kernels.
#
# nvcc is looked for in this order: CMAKE_CUDA_COMPILER (-D or cached), $CUDACXX,
# /usr/local/cuda/bin/nvcc, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH. With AUTO a tiny CUDA project
# is configured and built first, so a broken or too-new toolchain turns CUDA off with a message
# instead of failing the whole configure. Nothing here links the driver (libcuda): code only
# uses the runtime, so binaries built here load on machines without a GPU.

set(MG_HAS_CUDA OFF)
set(MG_CUDA_EMULATE OFF)
set(MG_CUDA_PTX_CHECK OFF)
if(MG_CUDA STREQUAL "EMULATE")
  # The CUDA emulation (cuda_emu/, docs/cuda-emulation.md): the .cu sources compiled by the host
  # compiler against the toolkit's headers, linked against the emulator instead of libcudart,
  # cuBLAS, cuDNN and NCCL. No nvcc, no GPU, no driver needed: only the headers.
  find_path(MG_CUDA_EMU_INCLUDE_DIR cuda_runtime.h cublas_v2.h
            HINTS "${CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda
            PATH_SUFFIXES include targets/x86_64-linux/include)
  find_package(Boost 1.66 QUIET COMPONENTS context)
  if(NOT MG_CUDA_EMU_INCLUDE_DIR)
    message(FATAL_ERROR "multigrad: MG_CUDA=EMULATE needs the CUDA toolkit's headers (cuda_runtime.h); "
                        "none found under CUDAToolkit_ROOT, CUDA_HOME, CUDA_PATH or /usr/local/cuda")
  endif()
  if(NOT Boost_CONTEXT_FOUND)
    message(FATAL_ERROR "multigrad: MG_CUDA=EMULATE needs Boost.Context (Debian: libboost-context-dev)")
  endif()
  set(MG_HAS_CUDA ON)
  set(MG_CUDA_EMULATE ON)
  set(CUDAToolkit_INCLUDE_DIRS "${MG_CUDA_EMU_INCLUDE_DIR}")
  message(STATUS "multigrad: CUDA EMULATED on the CPU (cuda_emu/): headers from ${MG_CUDA_EMU_INCLUDE_DIR}")
  return()
endif()
if(MG_CUDA STREQUAL "OFF")
  message(STATUS "multigrad: CUDA disabled (MG_CUDA=OFF)")
  return()
endif()

# ---- find nvcc ---------------------------------------------------------------------------------
set(_mg_nvcc "")
if(CMAKE_CUDA_COMPILER)
  set(_mg_nvcc "${CMAKE_CUDA_COMPILER}")
elseif(NOT "$ENV{CUDACXX}" STREQUAL "")
  set(_mg_nvcc "$ENV{CUDACXX}")
elseif(EXISTS "/usr/local/cuda/bin/nvcc")
  set(_mg_nvcc "/usr/local/cuda/bin/nvcc")
else()
  find_program(MG_NVCC_EXECUTABLE nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin)
  if(MG_NVCC_EXECUTABLE)
    set(_mg_nvcc "${MG_NVCC_EXECUTABLE}")
  endif()
endif()

if(_mg_nvcc STREQUAL "" OR NOT EXISTS "${_mg_nvcc}")
  if(_mg_nvcc STREQUAL "")
    set(_mg_why "no nvcc found (looked at CMAKE_CUDA_COMPILER, \$CUDACXX, /usr/local/cuda/bin/nvcc, \$CUDA_HOME, \$CUDA_PATH and PATH)")
  else()
    set(_mg_why "the CUDA compiler ${_mg_nvcc} (from CMAKE_CUDA_COMPILER or \$CUDACXX) does not exist")
  endif()
  if(MG_CUDA MATCHES "^(ON|PTX)$")
    message(FATAL_ERROR "multigrad: MG_CUDA=${MG_CUDA} but ${_mg_why}. Install the CUDA toolkit, "
                        "pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc, or configure with -DMG_CUDA=OFF.")
  endif()
  message(STATUS "multigrad: CUDA off: ${_mg_why}")
  return()
endif()

# ---- architectures -----------------------------------------------------------------------------
# MG_CUDA_ARCHS drives CMAKE_CUDA_ARCHITECTURES. A CMAKE_CUDA_ARCHITECTURES given explicitly on
# the first configure wins; after that, changing MG_CUDA_ARCHS takes effect.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR
   (DEFINED _MG_CUDA_ARCHS_APPLIED AND NOT "${MG_CUDA_ARCHS}" STREQUAL "${_MG_CUDA_ARCHS_APPLIED}"))
  set(CMAKE_CUDA_ARCHITECTURES "${MG_CUDA_ARCHS}" CACHE STRING "CUDA architectures" FORCE)
  set(_MG_CUDA_ARCHS_APPLIED "${MG_CUDA_ARCHS}" CACHE INTERNAL "")
endif()

# ---- does this nvcc work with this host compiler and these archs? -------------------------------
set(_mg_check_key "${_mg_nvcc}|${CMAKE_CUDA_ARCHITECTURES}|${CMAKE_CXX_COMPILER}")
if(NOT "${_MG_CUDA_CHECKED_KEY}" STREQUAL "${_mg_check_key}")
  set(_mg_dir "${CMAKE_BINARY_DIR}/CMakeFiles/mg_cuda_check")
  file(REMOVE_RECURSE "${_mg_dir}")
  file(WRITE "${_mg_dir}/src/CMakeLists.txt"
    "cmake_minimum_required(VERSION 3.18)\nproject(mg_cuda_check CUDA)\n"
    "add_library(mg_cuda_check OBJECT k.cu)\n")
  file(WRITE "${_mg_dir}/src/k.cu"
    "__global__ void scale(float* x, float a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] *= a;\n}\n")
  set(_mg_host "")
  if(CMAKE_CUDA_HOST_COMPILER)
    set(_mg_host "-DCMAKE_CUDA_HOST_COMPILER=${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  message(CHECK_START "multigrad: checking nvcc ${_mg_nvcc} (archs ${CMAKE_CUDA_ARCHITECTURES})")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${_mg_dir}/src" -B "${_mg_dir}/build" -G "${CMAKE_GENERATOR}"
            "-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}" "-DCMAKE_CUDA_COMPILER=${_mg_nvcc}"
            "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}" ${_mg_host}
    RESULT_VARIABLE _mg_rc OUTPUT_VARIABLE _mg_log ERROR_VARIABLE _mg_log)
  if(_mg_rc EQUAL 0)
    execute_process(COMMAND "${CMAKE_COMMAND}" --build "${_mg_dir}/build"
                    RESULT_VARIABLE _mg_rc OUTPUT_VARIABLE _mg_log2 ERROR_VARIABLE _mg_log2)
    string(APPEND _mg_log "${_mg_log2}")
  endif()
  if(_mg_rc EQUAL 0)
    message(CHECK_PASS "works")
    set(_MG_CUDA_WORKS ON CACHE INTERNAL "")
  else()
    message(CHECK_FAIL "failed")
    file(WRITE "${_mg_dir}/log.txt" "${_mg_log}")
    set(_MG_CUDA_WORKS OFF CACHE INTERNAL "")
  endif()
  set(_MG_CUDA_CHECKED_KEY "${_mg_check_key}" CACHE INTERNAL "")
endif()

if(NOT _MG_CUDA_WORKS)
  string(CONCAT _mg_why "${_mg_nvcc} could not build a CUDA file for archs '${CMAKE_CUDA_ARCHITECTURES}' "
                "(log: ${CMAKE_BINARY_DIR}/CMakeFiles/mg_cuda_check/log.txt)")
  if(MG_CUDA MATCHES "^(ON|PTX)$")
    message(FATAL_ERROR "multigrad: MG_CUDA=${MG_CUDA} but ${_mg_why}")
  endif()
  message(STATUS "multigrad: CUDA off: ${_mg_why}")
  return()
endif()

# ---- enable it ---------------------------------------------------------------------------------
set(CMAKE_CUDA_COMPILER "${_mg_nvcc}" CACHE FILEPATH "CUDA compiler" FORCE)
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)   # libcudart.so: one runtime shared by lib, tests, apps
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
if(MG_CUDA STREQUAL "PTX")
  set(MG_CUDA_PTX_CHECK ON)
  message(STATUS "multigrad: CUDA kernels compiled to PTX as a check only (MG_CUDA=PTX): nvcc "
                 "${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}; the library is the CPU build")
  return()
endif()
set(MG_HAS_CUDA ON)
message(STATUS "multigrad: CUDA on: nvcc ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}, "
               "toolkit ${CUDAToolkit_LIBRARY_ROOT}, archs ${CMAKE_CUDA_ARCHITECTURES}")
