# cmake/DionInstall.cmake — `cmake --install`: the libraries as the CMake package `dion`.
#
# Included once, last, by the root CMakeLists.txt (every target exists by then). Installs
#   lib/libdion*.a                  the exported libraries (static, position-independent)
#   include/dion/**                 their public headers
#   bin/dion-data                   the data tool, when built
#   lib/cmake/dion/dionConfig.cmake + dionConfigVersion.cmake + dionTargets*.cmake
# so that another project writes (tests/consumer/ does, in CI):
#   find_package(dion 0.1 REQUIRED)  # CMAKE_PREFIX_PATH: this prefix and torch's cmake prefix
#   target_link_libraries(app PRIVATE dion::dion dion::comm dion::data)
# dionConfig.cmake finds Torch (and fmt, nlohmann_json, CURL, PCRE2 for dion::data) itself.
#
# What consumers do NOT get: our warning flags (-Werror, -ffp-contract=off: the dion_warnings
# target), our precompiled headers, this machine's torch paths (dion::torch is rebuilt from the
# consumer's own find_package(Torch), which must find the version we built against).
# Not here: the Python module (cmake/DionPython.cmake; component "python", installed by pip).

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ---------------------------------------------------------------------------- what is exported
# TARGET:NAME, consumers link dion::NAME. Adding a library to the package is one line here;
# a target this configuration does not build (DION_DATA_ONLY, DION_SKIP_DATA) is skipped. A library that an exported one links
# PUBLIC must be listed too (install(EXPORT) refuses otherwise).
set(DION_EXPORTS
  dion_comm:comm
  dion:dion
  dion_data:data)

# dion_export_prepare(TARGET): makes TARGET's usage requirements installable, in place. The
# targets are written for the build tree (plain include paths, PRIVATE dion_warnings,
# ${TORCH_LIBRARIES}); rather than wrap every such line in generator expressions where the target
# is defined, the interface properties are rewritten here, once:
#   - dion_warnings: dropped from the interface (on a static library a PRIVATE link is
#     recorded as $<LINK_ONLY:dion_warnings>; it carries only compile flags) or build-only;
#   - absolute include directories (the source tree, torch's headers): build-only; the installed
#     interface gets ${CMAKE_INSTALL_INCLUDEDIR};
#   - the items of ${TORCH_LIBRARIES} (absolute paths into this machine's torch): build-only; the
#     installed interface links dion::torch, which dionConfig.cmake defines from the consumer's
#     own find_package(Torch);
#   - INTERFACE_PRECOMPILE_HEADERS: build-only;
#   - cxx_std_20 added as a compile feature: the public headers are C++20.
# Usage inside this build is unchanged: $<BUILD_INTERFACE:x> is x here.
function(dion_export_prepare target)
  target_compile_features(${target} PUBLIC cxx_std_20)   # the public headers are C++20
  get_target_property(libs ${target} INTERFACE_LINK_LIBRARIES)
  if(libs)
    set(out "")
    set(uses_torch FALSE)
    foreach(lib IN LISTS libs)
      if(lib STREQUAL "$<LINK_ONLY:dion_warnings>")
        continue()
      elseif(lib STREQUAL "dion_warnings")
        list(APPEND out "$<BUILD_INTERFACE:dion_warnings>")
      elseif(TORCH_LIBRARIES AND lib IN_LIST TORCH_LIBRARIES)
        list(APPEND out "$<BUILD_INTERFACE:${lib}>")
        set(uses_torch TRUE)
      else()
        list(APPEND out "${lib}")
      endif()
    endforeach()
    if(uses_torch)
      list(APPEND out "$<INSTALL_INTERFACE:dion::torch>")
    endif()
    set_property(TARGET ${target} PROPERTY INTERFACE_LINK_LIBRARIES "${out}")
  endif()

  foreach(prop INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
    get_target_property(dirs ${target} ${prop})
    if(dirs)
      set(out "")
      foreach(dir IN LISTS dirs)
        if(IS_ABSOLUTE "${dir}")
          list(APPEND out "$<BUILD_INTERFACE:${dir}>")
        else()
          list(APPEND out "${dir}")
        endif()
      endforeach()
      if(prop STREQUAL "INTERFACE_INCLUDE_DIRECTORIES")
        list(APPEND out "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
      endif()
      list(REMOVE_DUPLICATES out)
      set_property(TARGET ${target} PROPERTY ${prop} "${out}")
    endif()
  endforeach()

  get_target_property(pch ${target} INTERFACE_PRECOMPILE_HEADERS)
  if(pch)
    set_property(TARGET ${target} PROPERTY INTERFACE_PRECOMPILE_HEADERS "$<BUILD_INTERFACE:${pch}>")
  endif()
endfunction()

set(DION_EXPORTED_TARGETS "")   # dion_comm, dion, ... (as built here)
set(DION_EXPORTED_NAMES "")     # dion::comm, dion::dion, ...
foreach(entry IN LISTS DION_EXPORTS)
  string(REPLACE ":" ";" pair "${entry}")
  list(GET pair 0 target)
  list(GET pair 1 name)
  if(NOT TARGET ${target})
    continue()
  endif()
  dion_export_prepare(${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  list(APPEND DION_EXPORTED_TARGETS ${target})
  list(APPEND DION_EXPORTED_NAMES dion::${name})
  if(NOT TARGET dion::${name})
    add_library(dion::${name} ALIAS ${target})   # the same name inside this build
  endif()
endforeach()

# ---------------------------------------------------------------------------- install rules
install(TARGETS ${DION_EXPORTED_TARGETS} EXPORT dionTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dion)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dion DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
elseif(TARGET dion_data)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dion/data
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dion)
endif()
if(TARGET dion-data)
  install(TARGETS dion-data RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# ---------------------------------------------------------------------------- package files
set(DION_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dion)
install(EXPORT dionTargets NAMESPACE dion:: DESTINATION ${DION_CMAKE_DIR})

# What dionConfig.cmake must find before it loads dionTargets.cmake.
set(DION_CONFIG_NEEDS_TORCH OFF)
if(TARGET dion OR TARGET dion_comm)
  set(DION_CONFIG_NEEDS_TORCH ON)
endif()
set(DION_CONFIG_NEEDS_DATA_DEPS OFF)
if(TARGET dion_data)
  set(DION_CONFIG_NEEDS_DATA_DEPS ON)
endif()
if(NOT DEFINED Torch_VERSION)
  set(Torch_VERSION "")
endif()
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "")
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dionConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/dionConfig.cmake
  INSTALL_DESTINATION ${DION_CMAKE_DIR})
# 0.x: a minor version may change the API, so 0.1 accepts 0.1.* only.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dionConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dionConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/dionConfigVersion.cmake
        DESTINATION ${DION_CMAKE_DIR})
message(STATUS "dion: cmake --install exports ${DION_EXPORTED_NAMES}")

# ---------------------------------------------------------------------------- tests
# install_consumer: `cmake --install` into build/consumer-test/prefix, then tests/consumer (a
# separate project: find_package(dion), an MLP trained as examples/train_mlp.cpp does) configured,
# built and run against it.
if(DION_BUILD_TESTS AND TARGET dion AND TARGET dion_data)
  get_filename_component(DION_TORCH_CMAKE_PREFIX "${Torch_DIR}/.." ABSOLUTE)  # .../share/cmake
  add_test(NAME install_consumer
    COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
            -DWORK_DIR=${PROJECT_BINARY_DIR}/consumer-test -DTORCH_PREFIX=${DION_TORCH_CMAKE_PREFIX}
            -P ${PROJECT_SOURCE_DIR}/tests/consumer/run.cmake)
  # Installs everything built and compiles two files against LibTorch: 1-2 min on 2 busy cores.
  set_tests_properties(install_consumer PROPERTIES LABELS package TIMEOUT 900)
endif()

# pip_wheel: `pip wheel . --no-build-isolation` in a venv, the wheel installed into a fresh venv,
# one Muon step equal to the build tree's module (tests/wheel/run.sh). It builds the library and
# the bindings a second time, in ${PROJECT_BINARY_DIR}-wheel (a sibling of this build directory,
# so that with CCACHE_BASEDIR at the checkout and the same compiler, ccache serves this build's
# objects: scikit-build-core would otherwise set CXX to Python's g++, a different compiler name).
# Uncached about 10 min on 2 busy cores, cached about 2 min; RESOURCE_LOCK multiprocess keeps it
# away from the multi-process tests, which it would starve.
if(DION_BUILD_TESTS AND TARGET dion_python)
  add_test(NAME pip_wheel
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/wheel/run.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
            ${PROJECT_BINARY_DIR}/wheel-test ${PROJECT_BINARY_DIR}-wheel ${Python3_EXECUTABLE})
  set_tests_properties(pip_wheel PROPERTIES
    LABELS package TIMEOUT 1800 ${DION_MULTIPROCESS_TEST}
    ENVIRONMENT "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR};CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CXX=${CMAKE_CXX_COMPILER};CC=${CMAKE_C_COMPILER}")
endif()
