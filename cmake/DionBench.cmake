# cmake/DionBench.cmake — dion-bench, the benchmark program (tools/dion-bench, docs/benchmarks.md).
#
# Included by cmake/DionTorch.cmake after dion_executable exists. Needs CLI11 and nlohmann-json,
# found by cmake/DionData.cmake (skipped with DION_SKIP_DATA, like dion-train).
if(NOT TARGET CLI11::CLI11 OR NOT TARGET nlohmann_json::nlohmann_json)
  message(STATUS "dion: CLI11 / nlohmann-json not found (DION_SKIP_DATA?): dion-bench is not built")
  return()
endif()
dion_executable(dion-bench tools/dion-bench/main.cpp tools/dion-bench/measure.cpp)
target_include_directories(dion-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tools/dion-bench)
target_link_libraries(dion-bench PRIVATE CLI11::CLI11 nlohmann_json::nlohmann_json)
if(DION_BUILD_TESTS)
  # Smoke runs (seconds): every subcommand on tiny inputs; a bad argument is refused.
  add_test(NAME dion_bench_ortho_smoke COMMAND dion-bench ortho --shapes 64x96x2,96x64x1 --reps 1 --check)
  add_test(NAME dion_bench_step_smoke COMMAND dion-bench step --sets 64x1 --vocab 128 --reps 1)
  add_test(NAME dion_bench_micro_smoke COMMAND dion-bench micro --sizes 64 --reps 1)
  add_test(NAME dion_bench_bad_shape COMMAND dion-bench ortho --shapes 64x0x1)
  set_tests_properties(dion_bench_bad_shape PROPERTIES
                       PASS_REGULAR_EXPRESSION "--shapes.*expected positive integers")
endif()
