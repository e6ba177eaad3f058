# Install + export, so another project can:
#   find_package(multigrad REQUIRED)
#   target_link_libraries(app PRIVATE multigrad::multigrad)
#
# Layout under the prefix:
#   lib/libmultigrad.so*                       the library
#   include/multigrad/{multigrad.h,core/,...}  headers, folders preserved ("core/tensor.h" works)
#   lib/cmake/multigrad/                       multigradConfig.cmake, version file, targets
include(CMakePackageConfigHelpers)

set(_mg_install_targets multigrad)
if(MG_CUDA_EMULATE)
  list(APPEND _mg_install_targets mg_cuda_emu)  # the emulated runtime libmultigrad links
endif()
install(TARGETS ${_mg_install_targets} EXPORT multigradTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/multigrad)

# Headers are collected at install time (install(DIRECTORY)), so new ones need no re-configure.
set(MG_HEADER_DIRS base core kernels nn optim data parallel cuda_emu)
foreach(_dir IN LISTS MG_HEADER_DIRS)
  if(IS_DIRECTORY "${PROJECT_SOURCE_DIR}/${_dir}")
    install(DIRECTORY "${PROJECT_SOURCE_DIR}/${_dir}/"
            DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/multigrad/${_dir}"
            FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "*.cuh")
  endif()
endforeach()
# multigrad.h may appear after configure: install it if it exists at install time.
install(CODE "
  if(EXISTS \"${PROJECT_SOURCE_DIR}/multigrad.h\")
    file(INSTALL \"${PROJECT_SOURCE_DIR}/multigrad.h\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}/multigrad\")
  endif()")

set(MG_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/multigrad")
install(EXPORT multigradTargets NAMESPACE multigrad:: DESTINATION "${MG_CMAKE_INSTALL_DIR}")

# Values the config template needs to re-create the library's interface dependencies.
if(MG_HAS_CUDA)
  set(MG_CONFIG_CUDA_ROOT "${CUDAToolkit_LIBRARY_ROOT}")
  if(NOT MG_CONFIG_CUDA_ROOT)
    get_filename_component(MG_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  endif()
endif()
configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/multigradConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/multigradConfig.cmake"
  INSTALL_DESTINATION "${MG_CMAKE_INSTALL_DIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/multigradConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/multigradConfig.cmake"
              "${PROJECT_BINARY_DIR}/multigradConfigVersion.cmake"
        DESTINATION "${MG_CMAKE_INSTALL_DIR}")
