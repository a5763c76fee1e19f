# install() and the exported package: find_package(tessera) gives tessera::tessera.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS tessera EXPORT tesseraTargets)
install(EXPORT tesseraTargets NAMESPACE tessera:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tesseraConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/tesseraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tesseraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tesseraConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/tesseraConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
