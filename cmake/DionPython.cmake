# The Python module dion_cpp: the C++ optimizers as torch.optim.Optimizer subclasses.
#
# Builds the extension `_C` (python/bindings.cpp: pybind11 and the tensor casters shipped in
# the torch wheel, linked against libtorch_python) into ${CMAKE_BINARY_DIR}/python/dion_cpp/,
# next to symlinks to the pure-Python sources in python/dion_cpp/, so that after a normal build
#     PYTHONPATH=build/python python3 -c "import dion_cpp"
# works. `pip install .` (pyproject.toml, scikit-build-core) builds the target dion_python and
# installs the component "python" only. Skipped with a message when no Python 3 with headers
# or no libtorch_python is found.
find_package(Python3 COMPONENTS Interpreter Development.Module)
if(NOT Python3_FOUND)
  message(STATUS "dion: Python 3 (interpreter + headers) not found: dion_cpp module skipped")
  return()
endif()
find_library(DION_TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
if(NOT DION_TORCH_PYTHON_LIBRARY)
  message(STATUS "dion: libtorch_python not found in ${TORCH_INSTALL_PREFIX}/lib: dion_cpp module skipped")
  return()
endif()

set(DION_PYTHON_DIR "${CMAKE_BINARY_DIR}/python/dion_cpp")
Python3_add_library(dion_python MODULE WITH_SOABI python/bindings.cpp python/convert.cpp)
set_target_properties(dion_python PROPERTIES
  OUTPUT_NAME _C
  LIBRARY_OUTPUT_DIRECTORY "${DION_PYTHON_DIR}"
  CXX_VISIBILITY_PRESET hidden
  # Installed next to torch in site-packages: find libtorch*.so there.
  INSTALL_RPATH "$ORIGIN/../torch/lib")
target_compile_definitions(dion_python PRIVATE TORCH_EXTENSION_NAME=_C DION_VERSION="${PROJECT_VERSION}")
target_link_libraries(dion_python PRIVATE dion ${DION_TORCH_PYTHON_LIBRARY} dion_warnings)
target_precompile_headers(dion_python PRIVATE <torch/csrc/utils/pybind.h>)

# The pure-Python package: symlinks, so that edits to python/dion_cpp/*.py need no rebuild
# (a new file is picked up by the re-configure that CONFIGURE_DEPENDS triggers).
file(GLOB DION_PYTHON_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/python/dion_cpp/*.py")
file(MAKE_DIRECTORY "${DION_PYTHON_DIR}")
foreach(src ${DION_PYTHON_SOURCES})
  get_filename_component(name "${src}" NAME)
  file(CREATE_LINK "${src}" "${DION_PYTHON_DIR}/${name}" SYMBOLIC)
endforeach()

# Installed by pip only (`cmake --install --component python`); EXCLUDE_FROM_ALL keeps the module
# out of a plain `cmake --install` (the C++ package, cmake/DionInstall.cmake).
install(TARGETS dion_python LIBRARY DESTINATION dion_cpp COMPONENT python EXCLUDE_FROM_ALL)
install(FILES ${DION_PYTHON_SOURCES} DESTINATION dion_cpp COMPONENT python EXCLUDE_FROM_ALL)

# pytest suite: ctest -R python_tests (two ctest tests: the files that spawn Gloo jobs, and the
# rest in one process, which need not wait for the multi-process tests' one-at-a-time chain)
# (-rs: the reasons of any skips, which scripts/check_skips.py holds against tests/allowed_skips.txt;
# the live comparison needs a reference checkout: python_live_reference below.)
set(DION_PYTHON_MULTIPROCESS_FILES test_distributed.py test_expert_parallel.py test_placements.py test_qk_clip.py
    test_replicas.py)
set(_dion_py_multi "")
set(_dion_py_ignore --ignore=${PROJECT_SOURCE_DIR}/tests/python/test_live_reference.py
    --ignore=${PROJECT_SOURCE_DIR}/tests/python/test_live_ranges.py)
foreach(f ${DION_PYTHON_MULTIPROCESS_FILES})
  list(APPEND _dion_py_multi ${PROJECT_SOURCE_DIR}/tests/python/${f})
  list(APPEND _dion_py_ignore --ignore=${PROJECT_SOURCE_DIR}/tests/python/${f})
endforeach()
add_test(NAME python_tests
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${_dion_py_multi})
set_tests_properties(python_tests PROPERTIES
  ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TORCH_COMPILE_DISABLE=1"
  TIMEOUT 600
  # Its multi-process jobs never run beside test_dist's: 2 cores, up to 4 processes each.
  ${DION_MULTIPROCESS_TEST})
add_test(NAME python_tests_one_process
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${PROJECT_SOURCE_DIR}/tests/python ${_dion_py_ignore})
set_tests_properties(python_tests_one_process PROPERTIES
  ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TORCH_COMPILE_DISABLE=1;DION_PYTEST_ONE_PROCESS=1"
  TIMEOUT 600)

# The reference vectors again, in the environment they were recorded in (scalar ATen kernels,
# MKL's reproducible path; conftest.py sets one thread): every tensor must match bit for bit.
add_test(NAME python_reference_exact
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${PROJECT_SOURCE_DIR}/tests/python/test_reference_vectors.py)
set_tests_properties(python_reference_exact PROPERTIES
  ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TORCH_COMPILE_DISABLE=1;DION_REF_EXACT=1"
  TIMEOUT 300)
# ... and on an emulated Zen 4-like CPU: MKL's non-Intel code paths (the interposer of
# tests/support/mkl_non_intel.cpp preloaded), oneDNN capped at AVX512_CORE_BF16.
add_library(dion_test_mkl_non_intel SHARED ${PROJECT_SOURCE_DIR}/tests/support/mkl_non_intel.cpp)
add_test(NAME python_reference_exact_nonintel
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${PROJECT_SOURCE_DIR}/tests/python/test_reference_vectors.py)
set_tests_properties(python_reference_exact_nonintel PROPERTIES
  ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TORCH_COMPILE_DISABLE=1;DION_REF_EXACT=1;ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16;LD_PRELOAD=$<TARGET_FILE:dion_test_mkl_non_intel>;DION_EXPECT_MKL_NON_INTEL=1"
  TIMEOUT 300)

# dion_cpp against microsoft/dion itself, live: only with -DDION_REFERENCE_DIR=<a checkout of the
# reference> (tests/reference/README.md), never part of this repository or of the default suite.
set(DION_REFERENCE_DIR "" CACHE PATH "A checkout of microsoft/dion for ctest python_live_reference (optional)")
if(DION_REFERENCE_DIR)
  add_test(NAME python_live_reference
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${PROJECT_SOURCE_DIR}/tests/python/test_live_reference.py
                   ${PROJECT_SOURCE_DIR}/tests/python/test_live_ranges.py)
  set_tests_properties(python_live_reference PROPERTIES
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python:${DION_REFERENCE_DIR};TORCH_COMPILE_DISABLE=1"
    TIMEOUT 600)
endif()
