# The emulation build's CUDA front end (MG_CUDA=EMULATE only): how a .cu file reaches g++.
#
#   mg_emulate_cuda(<sources...> [TRACED])   compile these .cu files for the emulator (TRACED: with
#                                            the profiler's access instrumentation too)
#
# Each such file is compiled as C++ with cuda_emu/cuda_emulated.h forced in first, through
# mg-cu-rewrite (cuda_emu/cu_rewrite/), the compiler launcher that rewrites `<<<>>>` launches and
# `__shared__` declarations in the preprocessed text before g++ compiles it. The launcher is set for
# every target (CMAKE_CXX_COMPILER_LAUNCHER, ccache after it); it passes any other source through.
#
# mg-cu-rewrite is built at configure time, with the host compiler, before any target: every
# compile command names it. Changing its sources re-runs the configure step, which rebuilds it.

set(MG_TRACE_FLAGS -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -fsanitize-coverage=trace-pc
    -fno-tree-vectorize -fno-tree-slp-vectorize -fno-tree-sra -g1)

set(_mg_rw_dir "${PROJECT_SOURCE_DIR}/cuda_emu/cu_rewrite")
set(_mg_rw_sources "${_mg_rw_dir}/main.cpp" "${_mg_rw_dir}/cu_rewrite.cpp")
set(MG_CU_REWRITE "${PROJECT_BINARY_DIR}/bin/mg-cu-rewrite")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_mg_rw_sources} "${_mg_rw_dir}/cu_rewrite.h")
set(_mg_rw_stale FALSE)
foreach(_src IN LISTS _mg_rw_sources ITEMS "${_mg_rw_dir}/cu_rewrite.h")
  if(NOT EXISTS "${MG_CU_REWRITE}" OR "${_src}" IS_NEWER_THAN "${MG_CU_REWRITE}")
    set(_mg_rw_stale TRUE)
  endif()
endforeach()
if(_mg_rw_stale)
  file(MAKE_DIRECTORY "${PROJECT_BINARY_DIR}/bin")
  execute_process(
    COMMAND "${CMAKE_CXX_COMPILER}" -std=c++17 -O2 -Wall -Wextra "-I${PROJECT_SOURCE_DIR}" ${_mg_rw_sources}
            -o "${MG_CU_REWRITE}"
    RESULT_VARIABLE _mg_rw_rc OUTPUT_VARIABLE _mg_rw_out ERROR_VARIABLE _mg_rw_out)
  if(NOT _mg_rw_rc EQUAL 0)
    message(FATAL_ERROR "multigrad: building mg-cu-rewrite (cuda_emu/cu_rewrite/) failed:\n${_mg_rw_out}")
  endif()
  message(STATUS "multigrad: built ${MG_CU_REWRITE} (the emulation build's CUDA front end)")
endif()

# Every target made from here on compiles through it (ccache, when asked for, after it).
set(CMAKE_CXX_COMPILER_LAUNCHER "${MG_CU_REWRITE}" --compile ${CMAKE_CXX_COMPILER_LAUNCHER})

function(mg_emulate_cuda)
  cmake_parse_arguments(ARG "TRACED" "" "" ${ARGN})
  set(_opts -xc++ -include "${PROJECT_SOURCE_DIR}/cuda_emu/cuda_emulated.h" -Wno-unknown-pragmas)
  if(ARG_TRACED)
    list(APPEND _opts ${MG_TRACE_FLAGS})
  endif()
  set_source_files_properties(${ARG_UNPARSED_ARGUMENTS} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "${_opts}")
endfunction()

# mg-nvcc: plain .cu files -> a program on the emulator, in one step (cuda_emu/cu_rewrite/mg-nvcc.in).
# Two copies: bin/mg-nvcc in this build tree (the tutorial's test uses it), with absolute paths,
# and the installed one, whose paths are relative to the install prefix (found from the script's
# own location, so an installed tree can move).
include(GNUInstallDirs)
function(_mg_configure_nvcc out relocatable rewrite header includes libdir)
  set(MG_NVCC_RELOCATABLE ${relocatable})
  set(MG_NVCC_CXX "${CMAKE_CXX_COMPILER}")
  set(MG_NVCC_REWRITE "${rewrite}")
  set(MG_NVCC_HEADER "${header}")
  set(MG_NVCC_LIBDIR "${libdir}")
  set(MG_NVCC_INCLUDES "")
  foreach(_d IN LISTS includes)
    if(relocatable AND NOT IS_ABSOLUTE "${_d}")
      string(APPEND MG_NVCC_INCLUDES " \"-I\${PREFIX}${_d}\"")
    else()
      string(APPEND MG_NVCC_INCLUDES " \"-I${_d}\"")
    endif()
  endforeach()
  string(REPLACE ";" " " MG_NVCC_TRACE_FLAGS "${MG_TRACE_FLAGS}")
  configure_file("${PROJECT_SOURCE_DIR}/cuda_emu/cu_rewrite/mg-nvcc.in" "${out}" @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endfunction()
_mg_configure_nvcc("${PROJECT_BINARY_DIR}/bin/mg-nvcc" 0 "${MG_CU_REWRITE}"
  "${PROJECT_SOURCE_DIR}/cuda_emu/cuda_emulated.h" "${PROJECT_SOURCE_DIR};${MG_CUDA_EMU_INCLUDE_DIR}"
  "${PROJECT_BINARY_DIR}/cuda_emu")
set(_mg_inc "${CMAKE_INSTALL_INCLUDEDIR}/multigrad")
_mg_configure_nvcc("${PROJECT_BINARY_DIR}/install-bin/mg-nvcc" 1 "${CMAKE_INSTALL_BINDIR}/mg-cu-rewrite"
  "${_mg_inc}/cuda_emu/cuda_emulated.h" "${_mg_inc};${MG_CUDA_EMU_INCLUDE_DIR}" "${CMAKE_INSTALL_LIBDIR}")
install(PROGRAMS "${MG_CU_REWRITE}" "${PROJECT_BINARY_DIR}/install-bin/mg-nvcc" DESTINATION "${CMAKE_INSTALL_BINDIR}")
