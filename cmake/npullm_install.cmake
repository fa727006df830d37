# Installs the headers and a CMake package: find_package(npullm CONFIG) gives npullm::npullm.
include(CMakePackageConfigHelpers)

set(NPULLM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/npullm)

install(TARGETS npullm EXPORT npullmTargets)
# npullm::kernels (CMakeLists.txt): the per-ISA kernel libraries and the target linking them.
if(NPULLM_BUILD_KERNELS)
  install(TARGETS ${NPULLM_INSTALLED_KERNELS} npullm_kernels_all EXPORT npullmTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/npullm
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT npullmTargets
        NAMESPACE npullm::
        FILE npullmTargets.cmake
        DESTINATION ${NPULLM_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/npullmConfig.cmake.in
  ${PROJECT_BINARY_DIR}/npullmConfig.cmake
  INSTALL_DESTINATION ${NPULLM_INSTALL_CMAKEDIR})
# The headers suit any architecture; npullm::kernels, when installed, is this machine's.
if(NPULLM_BUILD_KERNELS)
  write_basic_package_version_file(
    ${PROJECT_BINARY_DIR}/npullmConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
else()
  write_basic_package_version_file(
    ${PROJECT_BINARY_DIR}/npullmConfigVersion.cmake
    COMPATIBILITY SameMinorVersion
    ARCH_INDEPENDENT)
endif()
install(FILES ${PROJECT_BINARY_DIR}/npullmConfig.cmake
              ${PROJECT_BINARY_DIR}/npullmConfigVersion.cmake
        DESTINATION ${NPULLM_INSTALL_CMAKEDIR})
