# cmake/DionTrainIO.cmake — the trainer's output formats: TensorBoard event files, safetensors,
# and their tests (the loss-curve plotter tools/dion-train/plot.py is Python and needs no build).
#
# Included by cmake/DionTorch.cmake after `dion_executable` and `dion_pch` exist. Defines:
#   dion_tb             static library: dion/train/tensorboard.h (plain C++, no LibTorch)
#   dion_safetensors    static library: dion/train/safetensors.h (LibTorch, no optimizer code);
#                       skipped with a message when nlohmann-json is absent (pip install .)
#   test_trainio_tb, test_trainio_safetensors   GoogleTest suites (tests/train/io), with tests
#   trainio_tool        writes / copies the files the Python tests read (tests/train/io)
#   ctest trainio_python_tests   pytest tests/train/io: the files read by the `tensorboard` and
#                                `safetensors` packages, and plot.py
add_library(dion_tb STATIC ${PROJECT_SOURCE_DIR}/src/train/io/tensorboard.cpp)
target_include_directories(dion_tb PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(dion_tb PRIVATE dion_warnings)
set_target_properties(dion_tb PROPERTIES POSITION_INDEPENDENT_CODE ON)

# nlohmann-json3-dev (scripts/setup.sh installs it). Optional here so that `pip install .`, which
# builds only the Python module, does not need it.
find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  message(STATUS "dion: nlohmann-json not found: dion_safetensors and the trainio tests skipped")
  return()
endif()
add_library(dion_safetensors STATIC ${PROJECT_SOURCE_DIR}/src/train/io/safetensors.cpp)
target_include_directories(dion_safetensors PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_include_directories(dion_safetensors SYSTEM PUBLIC ${_torch_inc})
target_link_libraries(dion_safetensors PUBLIC ${TORCH_LIBRARIES}
                      PRIVATE nlohmann_json::nlohmann_json dion_warnings)
set_target_properties(dion_safetensors PROPERTIES POSITION_INDEPENDENT_CODE ON)

if(NOT DION_BUILD_TESTS)
  return()
endif()

set(_trainio_tests ${PROJECT_SOURCE_DIR}/tests/train/io)

# No LibTorch here: the writer's test links the plain C++ library only.
add_executable(test_trainio_tb ${_trainio_tests}/test_tensorboard.cpp ${_trainio_tests}/event_reader.cpp)
target_link_libraries(test_trainio_tb PRIVATE dion_tb GTest::gtest_main dion_warnings)
gtest_discover_tests(test_trainio_tb DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS trainio)

dion_executable(test_trainio_safetensors ${_trainio_tests}/test_safetensors.cpp)
target_link_libraries(test_trainio_safetensors PRIVATE dion_safetensors GTest::gtest_main)
target_compile_definitions(test_trainio_safetensors PRIVATE DION_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(test_trainio_safetensors DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS trainio)

dion_executable(trainio_tool ${_trainio_tests}/trainio_tool.cpp)
target_link_libraries(trainio_tool PRIVATE dion_safetensors dion_tb)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME trainio_python_tests
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -rs ${_trainio_tests})
  set_tests_properties(trainio_python_tests PROPERTIES
    ENVIRONMENT "DION_TRAINIO_TOOL=$<TARGET_FILE:trainio_tool>;DION_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    LABELS trainio
    TIMEOUT 300)
endif()
