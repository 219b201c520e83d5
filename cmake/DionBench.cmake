# cmake/DionBench.cmake — dion-bench, the benchmark program (tools/dion-bench, docs/benchmarks.md).
#
# Included by cmake/DionTorch.cmake after dion_executable exists. Needs CLI11 and nlohmann-json,
# found by cmake/DionData.cmake (skipped with DION_SKIP_DATA, like dion-train).
if(NOT TARGET CLI11::CLI11 OR NOT TARGET nlohmann_json::nlohmann_json)
  message(STATUS "dion: CLI11 / nlohmann-json not found (DION_SKIP_DATA?): dion-bench is not built")
  return()
endif()
if(NOT TARGET dion_launch)
  message(STATUS "dion: the launcher library dion_launch is not built: dion-bench is not built")
  return()
endif()
dion_executable(dion-bench tools/dion-bench/main.cpp tools/dion-bench/measure.cpp tools/dion-bench/gpt_params.cpp
                tools/dion-bench/dist.cpp tools/dion-bench/args.cpp tools/dion-bench/step.cpp
                tools/dion-bench/algorithms.cpp)
# dist starts its ranks with the launcher library (dion/launch/launch.h, dion_launch).
target_include_directories(dion-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tools/dion-bench)
target_link_libraries(dion-bench PRIVATE dion dion_launch CLI11::CLI11 nlohmann_json::nlohmann_json)
if(DION_BUILD_TESTS)
  # Smoke runs (seconds): every subcommand on tiny inputs; a bad argument is refused.
  add_test(NAME dion_bench_ortho_smoke COMMAND dion-bench ortho --shapes 64x96x2,96x64x1 --reps 1 --check)
  add_test(NAME dion_bench_step_smoke COMMAND dion-bench step --sets 64x1 --vocab 128 --reps 1)
  add_test(NAME dion_bench_micro_smoke COMMAND dion-bench micro --sizes 64 --reps 1)
  # dist: 1 and 2 ranks on the 36 x 1 set (seconds; its shapes exercise the padding of one-matrix
  # megabatches and the rounding of Dion2's selected counts); the bytes every collective kind carried, on
  # every rank, must equal scripts/cost_model.py's formulas exactly (check --bench exits 1 if not).
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    set(_dist_json ${CMAKE_CURRENT_BINARY_DIR}/dion_bench_dist_smoke.jsonl)
    add_test(NAME dion_bench_dist_smoke
             COMMAND sh -c "rm -f '${_dist_json}' && \
'$<TARGET_FILE:dion-bench>' --json '${_dist_json}' dist --ranks 1,2 --sets 36x1 --reps 1 && \
'${Python3_EXECUTABLE}' '${CMAKE_CURRENT_SOURCE_DIR}/scripts/cost_model.py' check --bench '${_dist_json}'")
    set_tests_properties(dion_bench_dist_smoke PROPERTIES TIMEOUT 300 ${DION_MULTIPROCESS_TEST})
  endif()
  # --phases: every library phase of both families shows up (muon_pre / dion2_pre, orthogonalize, lion, ...).
  add_test(NAME dion_bench_step_phases_smoke COMMAND dion-bench step --sets 64x1 --vocab 128 --reps 1
                                                     --algos normuon,dion2 --paths exact,fast --phases)
  set_tests_properties(dion_bench_step_phases_smoke PROPERTIES
    PASS_REGULAR_EXPRESSION "normuon +exact phases.*muon_pre.*orthogonalize.*normuon_normalize.*lion.*adamw.*normuon +fast +phases.*normuon_update_fast.*dion2 +exact phases.*dion2_pre.*dion2_post")
  # A bad value: exit 2 naming the flag, before anything is measured (cmake/DionUsageTests.cmake).
  dion_add_usage_tests(PREFIX dion_bench TARGET dion-bench
    BAD "no_subcommand||subcommand is required"
        "shape_zero|ortho --shapes 64x0x1|--shapes"
        "shape_short|ortho --shapes 64x64|--shapes"
        "dtype|ortho --dtypes fp8|--dtypes"
        "reps_zero|ortho --reps 0|--reps"
        "reps_text|micro --reps abc|--reps"
        "sets|step --sets abc|--sets"
        "algos|step --algos adam|--algos"
        "paths|step --paths slow|--paths"
        "sizes_negative|micro --sizes -3|--sizes"
        "threads|--threads 0 ortho|--threads"
        "unknown|ortho --no-such-flag|--no-such-flag"
        "dist_ranks_zero|dist --ranks 0|--ranks"
        "dist_ranks_text|dist --ranks two|--ranks"
        "dist_two_sets|dist --sets 64x1,64x2|--sets"
        "dist_variant|dist --variants adam|--variants"
        "dist_variant_no_fraction|dist --variants dion2|--variants"
        "dist_variant_fraction|dist --variants dion@2|--variants"
        "dist_layout|dist --layouts tp|--layouts"
        "dist_reps|dist --reps 0|--reps"
    HELP "ortho.*step.*micro.*dist")
  add_test(NAME dion_bench.dist_help COMMAND dion-bench dist --help)
  set_tests_properties(dion_bench.dist_help PROPERTIES
    PASS_REGULAR_EXPRESSION "--ranks.*--sets.*--variants.*NAME@F.*--layouts.*fsdp.*ddp" TIMEOUT 60)
endif()
