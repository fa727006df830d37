# Installs the headers and a CMake package: find_package(npullm CONFIG) gives npullm::npullm.
include(CMakePackageConfigHelpers)

set(NPULLM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/npullm)

install(TARGETS npullm EXPORT npullmTargets)
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
# A header-only library: any architecture may use it.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/npullmConfigVersion.cmake
  COMPATIBILITY SameMinorVersion
  ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/npullmConfig.cmake
              ${PROJECT_BINARY_DIR}/npullmConfigVersion.cmake
        DESTINATION ${NPULLM_INSTALL_CMAKEDIR})
