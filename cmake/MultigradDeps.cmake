# Finds multigrad's optional dependencies and reports each one at configure time.
#
#   OpenBLAS  -> MG_HAS_OPENBLAS   (CPU sgemm; kernels fall back to their own loops without it)
#   OpenMP    -> MG_HAS_OPENMP     (CPU kernels' `#pragma omp` loops)
#   MPI       -> MG_HAS_MPI        (parallel/: MPI process group and launcher)
#   zlib      -> MG_HAS_ZLIB       (data/: reading the .gz Fashion-MNIST files)
#   cuDNN     -> MG_HAS_CUDNN      (CUDA builds only)
#   NCCL      -> MG_HAS_NCCL       (CUDA builds only)
#   CLI11, nlohmann_json           (examples, benchmarks and tests only: MG_HAS_CLI11, MG_HAS_NLOHMANN_JSON)
#
# mg_link_dependencies(<target>) attaches what was found to the library: the MG_HAS_* macros and
# the include directories are PUBLIC (consumers see the same configuration), the libraries are
# PRIVATE (by absolute path or by targets the package config re-creates), so the exported target
# works from an install prefix. The in-tree INTERFACE target `mg_extras` links every found
# library directly, for tests and benchmarks that call cblas/cuBLAS/cuDNN/NCCL/MPI themselves.

# ---- OpenBLAS ----------------------------------------------------------------------------------
# Debian's OpenBLASConfig.cmake sets OpenBLAS_INCLUDE_DIRS/OpenBLAS_LIBRARIES (no target); its
# cblas.h lives in /usr/include/x86_64-linux-gnu/openblas-pthread/, which no default search hits.
set(MG_HAS_OPENBLAS OFF)
find_package(OpenBLAS CONFIG QUIET)
set(_mg_blas_lib_hints "")
foreach(_l IN LISTS OpenBLAS_LIBRARIES)
  get_filename_component(_d "${_l}" DIRECTORY)
  list(APPEND _mg_blas_lib_hints "${_d}")
endforeach()
find_path(MG_CBLAS_INCLUDE_DIR cblas.h
  HINTS ${OpenBLAS_INCLUDE_DIRS} ENV OpenBLAS_HOME ENV OPENBLAS_ROOT
  PATH_SUFFIXES include openblas include/openblas openblas-pthread
                x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
# Which build of OpenBLAS. Debian ships the same library threaded two ways: with pthreads (the
# default alternative, libopenblas0-pthread) and with OpenMP (libopenblas0-openmp). multigrad's
# own kernels are OpenMP loops, and with the pthread build every GEMM's worker threads fight
# libgomp's threads, which keep spinning after each parallel region, for the same cores: the
# FashionCNN training step on 2 threads took 84-135 ms with it and 42 ms with the OpenMP build
# (1 thread: 77 ms; docs/nn-and-optim.md). So the OpenMP build is preferred when installed; the
# library's directory lands in the RUNPATH, since the system default stays the pthread one.
set(MG_OPENBLAS_THREADING "openmp" CACHE STRING
    "Prefer Debian's OpenMP (openmp) or pthread (pthread) build of OpenBLAS when both are installed")
set_property(CACHE MG_OPENBLAS_THREADING PROPERTY STRINGS openmp pthread)
if(MG_OPENBLAS_THREADING STREQUAL "openmp" AND CMAKE_LIBRARY_ARCHITECTURE)
  find_library(MG_OPENBLAS_LIBRARY NAMES libopenblas.so.0 openblas
    PATHS "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp" NO_DEFAULT_PATH)
endif()
find_library(MG_OPENBLAS_LIBRARY NAMES openblas
  HINTS ${_mg_blas_lib_hints} ENV OpenBLAS_HOME ENV OPENBLAS_ROOT PATH_SUFFIXES lib lib64)
if(MG_CBLAS_INCLUDE_DIR AND MG_OPENBLAS_LIBRARY)
  set(MG_HAS_OPENBLAS ON)
  message(STATUS "multigrad: OpenBLAS found at ${MG_OPENBLAS_LIBRARY} (cblas.h in ${MG_CBLAS_INCLUDE_DIR})")
else()
  message(STATUS "multigrad: OpenBLAS not found: CPU gemm uses its own loops "
                 "(Debian: apt-get install libopenblas-dev)")
endif()

# ---- OpenMP ------------------------------------------------------------------------------------
set(MG_HAS_OPENMP OFF)
if(MG_OPENMP)
  find_package(OpenMP COMPONENTS CXX QUIET)
  if(OpenMP_CXX_FOUND)
    set(MG_HAS_OPENMP ON)
    message(STATUS "multigrad: OpenMP ${OpenMP_CXX_VERSION} found (${OpenMP_CXX_FLAGS})")
  else()
    message(STATUS "multigrad: OpenMP not found: CPU kernels run single-threaded")
  endif()
else()
  message(STATUS "multigrad: OpenMP disabled (MG_OPENMP=OFF)")
endif()

# ---- MPI ---------------------------------------------------------------------------------------
set(MG_HAS_MPI OFF)
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  set(MG_HAS_MPI ON)
  execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE _mg_mpi_version
                  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REGEX MATCH "^[^\n]*" _mg_mpi_version "${_mg_mpi_version}")
  set(MG_MPI_IS_OPENMPI OFF)
  if(_mg_mpi_version MATCHES "Open MPI|OpenRTE")
    set(MG_MPI_IS_OPENMPI ON)
  endif()
  message(STATUS "multigrad: MPI ${MPI_CXX_VERSION} found (${_mg_mpi_version}; launcher ${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "multigrad: MPI not found: no MPI process group, mpi tests skipped "
                 "(Debian: apt-get install libopenmpi-dev openmpi-bin)")
endif()

# ---- zlib --------------------------------------------------------------------------------------
set(MG_HAS_ZLIB OFF)
find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  set(MG_HAS_ZLIB ON)
  message(STATUS "multigrad: zlib ${ZLIB_VERSION_STRING} found")
else()
  message(STATUS "multigrad: zlib not found: only uncompressed IDX files can be read")
endif()

# ---- header-only helpers for the binaries ------------------------------------------------------
find_package(CLI11 CONFIG QUIET)
find_package(nlohmann_json CONFIG QUIET)
foreach(_pkg CLI11 nlohmann_json)
  if(${_pkg}_FOUND)
    message(STATUS "multigrad: ${_pkg} found (examples, benchmarks and tests may use it)")
  else()
    message(STATUS "multigrad: ${_pkg} not found (examples, benchmarks and tests must do without)")
  endif()
endforeach()

# ---- cuDNN and NCCL ----------------------------------------------------------------------------
# Looked for under <NAME>_ROOT, the CUDA toolkit, the system, and pip wheels
# (site-packages/nvidia/{cudnn,nccl}, which ship only versioned .so files).
set(MG_HAS_CUDNN OFF)
set(MG_HAS_NCCL OFF)

# _mg_python_wheel_dirs(<out>): every <site-packages>/nvidia/{cudnn,nccl,cu13,cu12} folder, in
# <out>; the CUDA major version each was built for, in the parallel list <out>_CUDA_MAJORS ("?"
# when it can't be told), and the wheel it came from, in <out>_DISTS ("?" when unknown). The
# major comes from the folder's name (nvidia/cu13) or else from the wheel's metadata next to
# nvidia/ (nvidia_cudnn_cu12-9.1.0.70.dist-info claims nvidia/cudnn/...); when wheels for two
# CUDA majors both claim the folder, the one whose RECORD sizes match the files on disk wins.
function(_mg_python_wheel_dirs out)
  find_program(MG_PYTHON3 NAMES python3 python)
  set(_dirs "")
  set(_majors "")
  set(_dists "")
  if(MG_PYTHON3)
    # No import of the packages needed: only sys.path, the folders and the dist-info files.
    execute_process(COMMAND "${MG_PYTHON3}" -c [=[
import os, re, site, sys
paths = list(sys.path)
try:
    paths += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass

def wheel_of(sp, sub):
    """(cuda major, wheel name) of the nvidia-<sub>-cuNN wheel that installed sp/nvidia/<sub>."""
    m = re.fullmatch(r"cu(\d+)", sub)
    if m:
        return m.group(1), "nvidia/" + sub
    try:
        names = os.listdir(sp)
    except OSError:
        return "?", "?"
    found = []   # (major, dist-info name, RECORD rows under nvidia/<sub>/)
    for n in names:
        m = re.fullmatch(r"nvidia[-_]%s[-_]cu(\d+)-.*\.dist-info" % re.escape(sub), n, re.I)
        if not m:
            continue
        rows = []
        try:
            with open(os.path.join(sp, n, "RECORD"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.strip().rsplit(",", 2)
                    if len(parts) == 3 and parts[0].startswith("nvidia/%s/" % sub):
                        rows.append((parts[0], parts[2]))
        except OSError:
            pass
        found.append((m.group(1), n[: -len(".dist-info")], rows))
    if len({f[0] for f in found}) > 1:
        # Wheels for two CUDA majors wrote into one folder: keep the one whose files are there.
        def intact(rows):
            sized = [(p, s) for p, s in rows if s.isdigit()]
            return bool(sized) and all(
                os.path.isfile(os.path.join(sp, p)) and os.path.getsize(os.path.join(sp, p)) == int(s)
                for p, s in sized)
        found = [f for f in found if intact(f[2])] or found
    majors = {f[0] for f in found}
    if len(majors) == 1:
        return majors.pop(), found[0][1]
    return "?", "+".join(sorted(f[1] for f in found)) or "?"

seen = set()
for p in paths:
    for sub in ("cudnn", "nccl", "cu13", "cu12"):
        d = os.path.join(p or ".", "nvidia", sub)
        r = os.path.realpath(d)
        if os.path.isdir(d) and r not in seen:
            seen.add(r)
            major, dist = wheel_of(p or ".", sub)
            print("%s|%s|%s" % (r, major, dist))
]=]
      OUTPUT_VARIABLE _out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 30)
    string(REPLACE "\n" ";" _lines "${_out}")
    foreach(_line IN LISTS _lines)
      if(_line MATCHES "^(.+)\\|([^|]*)\\|([^|]*)$")
        list(APPEND _dirs "${CMAKE_MATCH_1}")
        list(APPEND _majors "${CMAKE_MATCH_2}")
        list(APPEND _dists "${CMAKE_MATCH_3}")
      endif()
    endforeach()
  endif()
  set(${out} "${_dirs}" PARENT_SCOPE)
  set(${out}_CUDA_MAJORS "${_majors}" PARENT_SCOPE)
  set(${out}_DISTS "${_dists}" PARENT_SCOPE)
endfunction()

# mg_find_cuda_package(<CUDNN|NCCL> <option> <header> <wheel-subdir> <lib names...>)
# Sets MG_<NAME>_INCLUDE_DIR, MG_<NAME>_LIBRARY, MG_<NAME>_VERSION and MG_HAS_<NAME> (parent scope).
function(mg_find_cuda_package name enabled header wheel_sub)
  set(libnames ${ARGN})
  set(pretty "${name}")
  if(name STREQUAL "CUDNN")
    set(pretty "cuDNN")
  endif()
  set(MG_HAS_${name} OFF PARENT_SCOPE)
  if(NOT ${enabled})
    message(STATUS "multigrad: ${pretty} disabled (${enabled}=OFF)")
    return()
  endif()
  set(roots ${${name}_ROOT} $ENV{${name}_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_INCLUDE_DIRS}/..)
  # Wheels built for another CUDA major than this toolkit's are left out: a cu12 cuDNN in a
  # CUDA 13 build links but fails at load time (libcudart.so.12/libcublas.so.12 not found).
  set(cuda_major "${CUDAToolkit_VERSION_MAJOR}")
  if(cuda_major STREQUAL "" AND CMAKE_CUDA_COMPILER_VERSION MATCHES "^([0-9]+)")
    set(cuda_major "${CMAKE_MATCH_1}")
  endif()
  set(skipped "")
  list(LENGTH MG_NVIDIA_WHEEL_DIRS n_wheel_dirs)
  list(LENGTH MG_NVIDIA_WHEEL_DIRS_CUDA_MAJORS n_wheel_majors)
  set(i 0)
  foreach(d IN LISTS MG_NVIDIA_WHEEL_DIRS)
    set(wheel_major "?")
    set(wheel "?")
    if(n_wheel_majors EQUAL n_wheel_dirs)
      list(GET MG_NVIDIA_WHEEL_DIRS_CUDA_MAJORS ${i} wheel_major)
      list(GET MG_NVIDIA_WHEEL_DIRS_DISTS ${i} wheel)
    endif()
    math(EXPR i "${i} + 1")
    if(NOT d MATCHES "/nvidia/(${wheel_sub}|cu[0-9]+)$")
      continue()
    endif()
    if(NOT wheel_major STREQUAL "?" AND NOT cuda_major STREQUAL "" AND
       NOT wheel_major STREQUAL cuda_major)
      message(STATUS "multigrad: ${pretty}: skipping the python wheel ${wheel} at ${d}: it was built "
                     "for CUDA ${wheel_major}, this build uses CUDA ${cuda_major} (CUDA toolkit "
                     "${CUDAToolkit_VERSION}); pip install nvidia-${wheel_sub}-cu${cuda_major} to use a wheel")
      list(APPEND skipped "${d}")
      continue()
    endif()
    if(wheel_major STREQUAL "?")
      message(STATUS "multigrad: ${pretty}: the python wheel folder ${d} does not say which CUDA major "
                     "it was built for (wheel: ${wheel}); using it as is")
    endif()
    list(APPEND roots "${d}")
  endforeach()
  # A result cached by an earlier configure from a wheel now skipped is looked up again.
  foreach(var MG_${name}_INCLUDE_DIR MG_${name}_LIBRARY)
    foreach(d IN LISTS skipped)
      if(${var})
        get_filename_component(real "${${var}}" REALPATH)
        string(FIND "${real}/" "${d}/" at)
        if(at EQUAL 0)
          message(STATUS "multigrad: ${pretty}: forgetting the cached ${var}=${${var}} (from the skipped wheel)")
          unset(${var} CACHE)
          unset(${var})
        endif()
      endif()
    endforeach()
  endforeach()
  find_path(MG_${name}_INCLUDE_DIR ${header} HINTS ${roots} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(MG_${name}_LIBRARY NAMES ${libnames} HINTS ${roots} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib)
  if(MG_${name}_INCLUDE_DIR AND MG_${name}_LIBRARY)
    set(ver "")
    if(name STREQUAL "CUDNN")
      set(vh "${MG_CUDNN_INCLUDE_DIR}/cudnn_version.h")
      if(NOT EXISTS "${vh}")
        set(vh "${MG_CUDNN_INCLUDE_DIR}/cudnn.h")
      endif()
      file(STRINGS "${vh}" defs REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
    else()
      file(STRINGS "${MG_NCCL_INCLUDE_DIR}/nccl.h" defs REGEX "#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    endif()
    foreach(def IN LISTS defs)
      string(REGEX MATCH "[0-9]+$" num "${def}")
      list(APPEND ver "${num}")
    endforeach()
    list(JOIN ver "." ver)
    set(MG_${name}_VERSION "${ver}" PARENT_SCOPE)
    set(MG_HAS_${name} ON PARENT_SCOPE)
    message(STATUS "multigrad: ${pretty} ${ver} found at ${MG_${name}_LIBRARY} (${header} in ${MG_${name}_INCLUDE_DIR})")
  else()
    set(why "")
    if(skipped)
      list(LENGTH skipped n_skipped)
      set(why "; ${n_skipped} python wheel folder(s) skipped: built for another CUDA major than ${cuda_major}")
    endif()
    message(STATUS "multigrad: ${pretty} not found (looked in ${name}_ROOT, the CUDA toolkit, "
                   "system paths and python site-packages/nvidia/${wheel_sub}${why})")
  endif()
endfunction()

if(MG_CUDA_EMULATE)
  # The emulator (cuda_emu/) provides cuDNN's and NCCL's entry points; only the headers are used.
  # Its NCCL travels over MPI, so NCCL is there when MPI is.
  foreach(_name CUDNN NCCL)
    string(TOLOWER "${_name}" _lower)
    find_path(MG_${_name}_INCLUDE_DIR ${_lower}.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(MG_${_name}_INCLUDE_DIR AND MG_WITH_${_name} AND (MG_HAS_MPI OR _name STREQUAL "CUDNN"))
      set(MG_HAS_${_name} ON)
      message(STATUS "multigrad: ${_lower} EMULATED (cuda_emu/${_lower}.cpp; ${_lower}.h in ${MG_${_name}_INCLUDE_DIR})")
    endif()
  endforeach()
elseif(MG_HAS_CUDA)
  _mg_python_wheel_dirs(MG_NVIDIA_WHEEL_DIRS)
  mg_find_cuda_package(CUDNN MG_WITH_CUDNN cudnn.h cudnn cudnn libcudnn.so.9 libcudnn.so.8)
  mg_find_cuda_package(NCCL MG_WITH_NCCL nccl.h nccl nccl libnccl.so.2)
endif()

# ---- attach to a target ------------------------------------------------------------------------
function(mg_link_dependencies tgt)
  foreach(dep CUDA CUDNN NCCL OPENBLAS OPENMP MPI ZLIB)
    if(MG_HAS_${dep})
      target_compile_definitions(${tgt} PUBLIC MG_HAS_${dep}=1)
    endif()
  endforeach()
  if(MG_CUDA_EMULATE)
    # The emulator stands in for libcudart, cuBLAS, cuDNN and NCCL (PUBLIC: tests and benchmarks
    # call the runtime too).
    target_compile_definitions(${tgt} PUBLIC MG_CUDA_EMULATE=1)
    target_link_libraries(${tgt} PUBLIC mg_cuda_emu)
  elseif(MG_HAS_CUDA)
    # cudart is PUBLIC: headers may expose cudaStream_t; cuBLAS(Lt) stays inside the library.
    target_link_libraries(${tgt} PUBLIC CUDA::cudart PRIVATE CUDA::cublas CUDA::cublasLt)
  endif()
  if(MG_HAS_CUDNN)
    target_include_directories(${tgt} PUBLIC "${MG_CUDNN_INCLUDE_DIR}")
    if(NOT MG_CUDA_EMULATE)
      target_link_libraries(${tgt} PRIVATE "${MG_CUDNN_LIBRARY}")
    endif()
  endif()
  if(MG_HAS_NCCL)
    target_include_directories(${tgt} PUBLIC "${MG_NCCL_INCLUDE_DIR}")
    if(NOT MG_CUDA_EMULATE)
      target_link_libraries(${tgt} PRIVATE "${MG_NCCL_LIBRARY}")
    endif()
  endif()
  if(MG_HAS_OPENBLAS)
    # PUBLIC so `#include <cblas.h>` finds OpenBLAS's header, not whatever /usr/include has.
    target_include_directories(${tgt} PUBLIC "${MG_CBLAS_INCLUDE_DIR}")
    target_link_libraries(${tgt} PRIVATE "${MG_OPENBLAS_LIBRARY}")
  endif()
  if(MG_HAS_OPENMP)
    target_link_libraries(${tgt} PRIVATE OpenMP::OpenMP_CXX)
  endif()
  if(MG_HAS_MPI)
    target_link_libraries(${tgt} PRIVATE MPI::MPI_CXX)
  endif()
  if(MG_HAS_ZLIB)
    target_link_libraries(${tgt} PRIVATE ZLIB::ZLIB)
  endif()
endfunction()

# Everything found, linked directly: for tests and benchmarks (never installed or exported).
add_library(mg_extras INTERFACE)
if(MG_CUDA_EMULATE)
  target_link_libraries(mg_extras INTERFACE mg_cuda_emu)
elseif(MG_HAS_CUDA)
  target_link_libraries(mg_extras INTERFACE CUDA::cudart CUDA::cublas CUDA::cublasLt)
endif()
if(MG_HAS_CUDNN AND NOT MG_CUDA_EMULATE)
  target_link_libraries(mg_extras INTERFACE "${MG_CUDNN_LIBRARY}")
endif()
if(MG_HAS_NCCL AND NOT MG_CUDA_EMULATE)
  target_link_libraries(mg_extras INTERFACE "${MG_NCCL_LIBRARY}")
endif()
if(MG_HAS_OPENBLAS)
  target_link_libraries(mg_extras INTERFACE "${MG_OPENBLAS_LIBRARY}")
endif()
if(MG_HAS_OPENMP)
  target_link_libraries(mg_extras INTERFACE OpenMP::OpenMP_CXX)
endif()
if(MG_HAS_MPI)
  target_link_libraries(mg_extras INTERFACE MPI::MPI_CXX)
endif()
if(MG_HAS_ZLIB)
  target_link_libraries(mg_extras INTERFACE ZLIB::ZLIB)
endif()
if(CLI11_FOUND)
  target_link_libraries(mg_extras INTERFACE CLI11::CLI11)
  target_compile_definitions(mg_extras INTERFACE MG_HAS_CLI11=1)
endif()
if(nlohmann_json_FOUND)
  target_link_libraries(mg_extras INTERFACE nlohmann_json::nlohmann_json)
  target_compile_definitions(mg_extras INTERFACE MG_HAS_NLOHMANN_JSON=1)
endif()
