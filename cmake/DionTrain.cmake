# cmake/DionTrain.cmake — dion-train: the GPT training program (docs/train.md).
#
# Included by cmake/DionTorch.cmake once the `dion` library, `dion_pch` and `dion_executable`
# exist. Needs the data tools (cmake/DionData.cmake: dion_data, CLI11, fmt, nlohmann_json).
# Defines:
#   dion_train        static library (include/dion/train, src/train): config, GPT, loader,
#                     optimizer setup, checkpoints, metrics, the loop
#   dion-train        the program (tools/dion-train)
#   dion_launch       static library: the local launcher of `dion-train --nproc N` and `dion-bench dist` (src/launch: launch.cpp, and its multi-node flags and restarts, nodes.cpp)
#   dion_train_tests  GoogleTest suite (tests/train), with DION_BUILD_TESTS; label "train"
#   dion_launch_tests GoogleTest suite of the launcher (tests/tools), with launch_child
#   dion_train_parallel_tests  the multi-process runs (tests/train/parallel/test_parallel.cpp)
if(NOT TARGET dion_data)
  message(STATUS "dion: the data tools are off (DION_SKIP_DATA): dion-train is not built")
  return()
endif()
find_package(yaml-cpp REQUIRED)  # libyaml-cpp-dev
find_package(ZLIB REQUIRED)      # zlib1g-dev: the CRC-32 of checkpoint files (checkpoint_files.h)

set(DION_TRAIN_ROOT "${CMAKE_CURRENT_LIST_DIR}/..")
cmake_path(NORMAL_PATH DION_TRAIN_ROOT)
string(REGEX REPLACE "/$" "" DION_TRAIN_ROOT "${DION_TRAIN_ROOT}")

add_library(dion_train STATIC
  ${DION_TRAIN_ROOT}/src/train/model/autocast.cpp
  ${DION_TRAIN_ROOT}/src/train/io/checkpoint_common.cpp
  ${DION_TRAIN_ROOT}/src/train/io/checkpoint_write.cpp
  ${DION_TRAIN_ROOT}/src/train/io/checkpoint_verify.cpp
  ${DION_TRAIN_ROOT}/src/train/io/checkpoint_load.cpp
  ${DION_TRAIN_ROOT}/src/train/io/checkpoint_files.cpp
  ${DION_TRAIN_ROOT}/src/train/config_help.cpp
  ${DION_TRAIN_ROOT}/src/train/config_io.cpp
  ${DION_TRAIN_ROOT}/src/train/config_keys.cpp
  ${DION_TRAIN_ROOT}/src/train/config_rules.cpp
  ${DION_TRAIN_ROOT}/src/train/optimizer_catalog.cpp
  ${DION_TRAIN_ROOT}/src/train/optimizer_entries.cpp
  ${DION_TRAIN_ROOT}/src/train/io/fs_util.cpp
  ${DION_TRAIN_ROOT}/src/train/model/generate.cpp
  ${DION_TRAIN_ROOT}/src/train/model/gpt.cpp
  ${DION_TRAIN_ROOT}/src/train/model/moe.cpp
  ${DION_TRAIN_ROOT}/src/train/grad_norm.cpp
  ${DION_TRAIN_ROOT}/src/train/graphed_step.cpp
  ${DION_TRAIN_ROOT}/src/train/model/cross_entropy_cpu.cpp
  ${DION_TRAIN_ROOT}/src/train/model/fused_cpu.cpp
  ${DION_TRAIN_ROOT}/src/train/model/router_cpu.cpp
  ${DION_TRAIN_ROOT}/src/train/model/transpose_cpu.cpp
  ${DION_TRAIN_ROOT}/src/train/model/kernels.cpp
  ${DION_TRAIN_ROOT}/src/train/model/fit.cpp
  ${DION_TRAIN_ROOT}/src/train/loader.cpp
  ${DION_TRAIN_ROOT}/src/train/io/metrics.cpp
  ${DION_TRAIN_ROOT}/src/train/mfu.cpp
  ${DION_TRAIN_ROOT}/src/train/optim_setup.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/mesh.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/plan.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/layout.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/parallel.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/fsdp.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/tp.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/ep.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/ddp.cpp
  ${DION_TRAIN_ROOT}/src/train/parallel/replicas.cpp
  ${DION_TRAIN_ROOT}/src/train/resume_policy.cpp
  ${DION_TRAIN_ROOT}/src/train/train.cpp
  ${DION_TRAIN_ROOT}/src/train/trainer.cpp
  ${DION_TRAIN_ROOT}/src/train/trainer_report.cpp
  ${DION_TRAIN_ROOT}/src/train/trainer_setup.cpp
  ${DION_TRAIN_ROOT}/src/train/qk_clip.cpp)
target_link_libraries(dion_train
  PUBLIC dion dion_data dion_tb dion_safetensors
  PRIVATE yaml-cpp ZLIB::ZLIB CLI11::CLI11 nlohmann_json::nlohmann_json dion_warnings)
# <fmt/format.h> resolves to the fmt bundled in torch's include folder (v12) before Debian's (v9,
# a shared library): use it header-only so that no fmt library symbols are needed.
target_compile_definitions(dion_train PUBLIC FMT_HEADER_ONLY)
target_precompile_headers(dion_train REUSE_FROM dion_pch)
# GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_* operands as uninitialized.
set_source_files_properties(${DION_TRAIN_ROOT}/src/train/model/cross_entropy_cpu.cpp
  ${DION_TRAIN_ROOT}/src/train/model/transpose_cpu.cpp PROPERTIES COMPILE_OPTIONS "-Wno-uninitialized;-Wno-maybe-uninitialized")
# No FP exception flags are read anywhere: without trapping math GCC vectorizes the fused kernels'
# float compares (the same results; fused_cpu.cpp).
set_source_files_properties(${DION_TRAIN_ROOT}/src/train/model/fused_cpu.cpp
  PROPERTIES COMPILE_OPTIONS "-fno-trapping-math")
set_source_files_properties(
  ${DION_TRAIN_ROOT}/src/train/config_help.cpp ${DION_TRAIN_ROOT}/src/train/config_io.cpp
  ${DION_TRAIN_ROOT}/src/train/config_keys.cpp ${DION_TRAIN_ROOT}/src/train/config_rules.cpp
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)

# The local launcher of `dion-train --nproc N` and `dion-bench dist` (include/dion/launch,
# src/launch; no LibTorch; its own test runs it on a stub child).
add_library(dion_launch STATIC ${DION_TRAIN_ROOT}/src/launch/launch.cpp ${DION_TRAIN_ROOT}/src/launch/nodes.cpp)
target_include_directories(dion_launch PUBLIC ${DION_TRAIN_ROOT}/include)
target_link_libraries(dion_launch PRIVATE dion_warnings)

dion_executable(dion-train
  ${DION_TRAIN_ROOT}/tools/dion-train/main.cpp
  ${DION_TRAIN_ROOT}/tools/dion-train/sample.cpp
  ${DION_TRAIN_ROOT}/tools/dion-train/export.cpp
  ${DION_TRAIN_ROOT}/tools/dion-train/test_hooks.cpp)
target_link_libraries(dion-train PRIVATE dion_train dion_launch CLI11::CLI11)
target_compile_definitions(dion-train PRIVATE
  DION_SOURCE_DIR="${DION_TRAIN_ROOT}"
  DION_TRAIN_PLOT_SCRIPT="${DION_TRAIN_ROOT}/tools/dion-train/plot.py")
set_target_properties(dion-train PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

if(DION_BUILD_TESTS)
  # A test binary that runs dion-train (the program built here) from tests/train/**/*.cpp.
  function(dion_train_test_binary name)
    dion_executable(${name} ${ARGN} ${DION_TRAIN_ROOT}/tests/train/train_test_util.cpp)
    target_link_libraries(${name} PRIVATE
      dion_train GTest::gtest GTest::gtest_main nlohmann_json::nlohmann_json)
    target_include_directories(${name} PRIVATE ${DION_TRAIN_ROOT}/tests/train   # train_test_util.h
                                               ${DION_TRAIN_ROOT}/tests/support) # cpu_kind.h
    target_compile_definitions(${name} PRIVATE
      DION_SOURCE_DIR="${DION_TRAIN_ROOT}"
      DION_TRAIN_EXE="$<TARGET_FILE:dion-train>")
    add_dependencies(${name} dion-train)
  endfunction()
  dion_train_test_binary(dion_train_tests
    ${DION_TRAIN_ROOT}/tests/train/test_config.cpp
    ${DION_TRAIN_ROOT}/tests/train/model/test_gpt.cpp
    ${DION_TRAIN_ROOT}/tests/train/model/test_kernels.cpp
    ${DION_TRAIN_ROOT}/tests/train/model/test_fused_cpu.cpp
    ${DION_TRAIN_ROOT}/tests/train/model/test_moe.cpp
    ${DION_TRAIN_ROOT}/tests/train/model/test_router_cpu.cpp
    ${DION_TRAIN_ROOT}/tests/train/test_graphs.cpp
    ${DION_TRAIN_ROOT}/tests/train/test_loader.cpp
    ${DION_TRAIN_ROOT}/tests/train/test_run.cpp
    ${DION_TRAIN_ROOT}/tests/train/io/test_train_checkpoint.cpp
    ${DION_TRAIN_ROOT}/tests/train/test_trainer.cpp
    ${DION_TRAIN_ROOT}/tests/train/test_vocab.cpp
    ${DION_TRAIN_ROOT}/tests/train/parallel/test_layout.cpp)
  # The launcher, on tests/tools/launch_child.cpp as the ranks (multi-process: one at a time).
  add_executable(launch_child ${DION_TRAIN_ROOT}/tests/tools/launch_child.cpp)
  target_link_libraries(launch_child PRIVATE dion_warnings)
  add_executable(dion_launch_tests ${DION_TRAIN_ROOT}/tests/tools/test_launch.cpp)
  target_link_libraries(dion_launch_tests PRIVATE dion_launch GTest::gtest GTest::gtest_main dion_warnings)
  target_compile_definitions(dion_launch_tests PRIVATE LAUNCH_CHILD_EXE="$<TARGET_FILE:launch_child>")
  add_dependencies(dion_launch_tests launch_child)
  gtest_discover_tests(dion_launch_tests
    DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS train TIMEOUT 120 ${DION_MULTIPROCESS_TEST})
  dion_add_usage_tests(PREFIX dion_train TARGET dion-train
    BAD "nproc_zero|--nproc 0|--nproc"
        "nproc_text|--nproc abc|--nproc"
        "nproc_missing|--nproc|--nproc"
        "nproc_bad_key|--nproc 2 --lr fast|key .lr.: value .fast. is not a number"
    HELP "--nproc N")
  # The subcommands' flags (CLI11 through tools/dion-train/cli.h): exit 2 naming the flag, before
  # any checkpoint is read (so a missing CHECKPOINT path does not matter here).
  dion_add_usage_tests(PREFIX dion_train_sample TARGET dion-train
    BAD "no_checkpoint|sample|--checkpoint is required"
        "checkpoint_missing_value|sample --checkpoint|--checkpoint"
        "max_tokens_text|sample --checkpoint ck --max_tokens abc|--max_tokens"
        "max_tokens_zero|sample --checkpoint ck --max_tokens 0|--max_tokens"
        "temperature_negative|sample --checkpoint ck --temperature -1|--temperature"
        "top_k_negative|sample --checkpoint ck --top_k -3|--top_k: Value -3 not in range 0 to 2147483647"
        "seed_text|sample --checkpoint ck --seed abc|--seed"
        "unknown_flag|sample --checkpoint ck --no-such-flag|--no-such-flag")
  dion_add_usage_tests(PREFIX dion_train_export TARGET dion-train
    BAD "no_checkpoint|export|--checkpoint is required"
        "output_missing_value|export --checkpoint ck -o|--output"
        "unknown_flag|export --checkpoint ck --no-such-flag|--no-such-flag")
  # Each subcommand's --help explains every option (exit 0).
  foreach(_sub sample export plot)
    add_test(NAME dion_train_${_sub}.help COMMAND dion-train ${_sub} --help)
  endforeach()
  set_tests_properties(dion_train_sample.help PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
    "--checkpoint[^\n]*a checkpoint folder.*--prompt[^\n]*text to continue.*--max_tokens[^\n]*\n?[^\n]*tokens to generate.*--temperature.*--top_k.*--seed.*--tokenizer")
  set_tests_properties(dion_train_export.help PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
    "--checkpoint[^\n]*a checkpoint folder.*-o,--output[^\n]*the .safetensors file")
  set_tests_properties(dion_train_plot.help PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
    "RUN_DIR[^\n]*a run folder holding metrics.jsonl.*--output[^\n]*\n?[^\n]*the PNG to write.*--smooth")
  # `dion-train plot` (plot.py): bad arguments exit 2 (argparse), bad data or output path 1,
  # each with a message and never a Python traceback (tests/train/plot_cli_test.sh).
  foreach(_case missing_run_dir run_dir_without_metrics output_folder_missing output_is_a_folder
                no_run_dir output_missing_value bad_smooth unknown_flag)
    add_test(NAME dion_train_plot.${_case}
             COMMAND sh ${DION_TRAIN_ROOT}/tests/train/plot_cli_test.sh $<TARGET_FILE:dion-train> ${_case})
    set_tests_properties(dion_train_plot.${_case} PROPERTIES LABELS train TIMEOUT 60)
  endforeach()

  # bench/convergence.py --smoke: the benchmark's plumbing (byte shards, two optimizers, the
  # report and both PNGs), not its numbers (tests/scripts/convergence_smoke.sh).
  add_test(NAME convergence_smoke
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/convergence_smoke.sh ${DION_PYTHON3} ${DION_TRAIN_ROOT}
                   $<TARGET_FILE_DIR:dion-train> ${CMAKE_CURRENT_BINARY_DIR}/convergence-smoke)
  set_tests_properties(convergence_smoke PROPERTIES LABELS train TIMEOUT 180)
  # bench/width_study.py --smoke: the width study's plumbing (tests/scripts/width_smoke.sh).
  add_test(NAME width_smoke
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/width_smoke.sh ${DION_PYTHON3} ${DION_TRAIN_ROOT}
                   $<TARGET_FILE_DIR:dion-train> ${CMAKE_CURRENT_BINARY_DIR}/width-smoke)
  set_tests_properties(width_smoke PROPERTIES LABELS train TIMEOUT 180)
  # bench/best_vs_best.py --smoke: the best-against-best study's plumbing (tests/scripts/best_smoke.sh).
  add_test(NAME best_smoke
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/best_smoke.sh ${DION_PYTHON3} ${DION_TRAIN_ROOT}
                   $<TARGET_FILE_DIR:dion-train> ${CMAKE_CURRENT_BINARY_DIR}/best-smoke)
  set_tests_properties(best_smoke PROPERTIES LABELS train TIMEOUT 180)
  # bench/moe_convergence.py and bench/moe_speed.py --smoke (tests/scripts/moe_bench_smoke.sh).
  add_test(NAME moe_bench_smoke
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/moe_bench_smoke.sh ${DION_PYTHON3} ${DION_TRAIN_ROOT}
                   $<TARGET_FILE_DIR:dion-train> ${CMAKE_CURRENT_BINARY_DIR}/moe-bench-smoke)
  set_tests_properties(moe_bench_smoke PROPERTIES LABELS train TIMEOUT 180 ${DION_MULTIPROCESS_TEST})
  # The project's CPU kernels on an emulated AMD Zen 3 (AVX2) and an emulated CPU without AVX
  # (qemu-user; tests/scripts/emulated_cpu_kinds.sh): their AVX2 and baseline code, which an
  # AVX-512 machine never runs.
  add_test(NAME emulated_cpu_kinds
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/emulated_cpu_kinds.sh $<TARGET_FILE:test_elementwise>
                   $<TARGET_FILE:dion_train_tests>)
  set_tests_properties(emulated_cpu_kinds PROPERTIES LABELS train TIMEOUT 600)
  # bench/ngram_baseline.py at order 3 on a small byte shard set, against a plain rewrite
  # (tests/scripts/ngram_smoke.sh).
  add_test(NAME ngram_smoke
           COMMAND sh ${DION_TRAIN_ROOT}/tests/scripts/ngram_smoke.sh ${DION_PYTHON3} ${DION_TRAIN_ROOT}
                   $<TARGET_FILE_DIR:dion-train> ${CMAKE_CURRENT_BINARY_DIR}/ngram-smoke)
  set_tests_properties(ngram_smoke PROPERTIES LABELS train TIMEOUT 120)
  gtest_discover_tests(dion_train_tests
    WORKING_DIRECTORY ${DION_TRAIN_ROOT}
    DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS train TIMEOUT 300)
  # The fast kind's fp32 plan is chosen by CPU (kernels.cpp): its kernel tests run under every
  # plan on every CPU, so that none goes untested where another is the default.
  foreach(_plan onednn mkl mixed)
    add_test(NAME TrainKernels.fast_fp32_${_plan}
             COMMAND dion_train_tests --gtest_filter=TrainKernels.*:-TrainKernels.Bf16*
             WORKING_DIRECTORY ${DION_TRAIN_ROOT})
    set_tests_properties(TrainKernels.fast_fp32_${_plan} PROPERTIES LABELS train TIMEOUT 300
                         ENVIRONMENT DION_FAST_FP32=${_plan})
  endforeach()
  # A plan that does not exist is an error that names the valid ones (no silent default).
  add_test(NAME TrainKernels.fast_fp32_bad_plan
           COMMAND dion_train_tests --gtest_filter=TrainKernels.MatmulEqualsAtenMmInEveryLayout
           WORKING_DIRECTORY ${DION_TRAIN_ROOT})
  set_tests_properties(TrainKernels.fast_fp32_bad_plan PROPERTIES LABELS train TIMEOUT 120
                       ENVIRONMENT DION_FAST_FP32=avx512 PASS_REGULAR_EXPRESSION
                       "DION_FAST_FP32='avx512': valid values are 'mkl', 'onednn' and 'mixed'")
  # ATen's capability "default" leaves the one-pass loss kernel out (cross_entropy_cpu.h): the fast
  # kind's fallback to ATen's log-softmax, which a CPU without AVX2 takes, is checked there.
  add_test(NAME TrainKernels.aten_loss
           COMMAND dion_train_tests --gtest_filter=TrainKernels.*
           WORKING_DIRECTORY ${DION_TRAIN_ROOT})
  set_tests_properties(TrainKernels.aten_loss PROPERTIES LABELS train TIMEOUT 300
                       ENVIRONMENT ATEN_CPU_CAPABILITY=default)
  # Parallel layouts: several dion-train processes per test, one such test at a time
  # (RESOURCE_LOCK multiprocess, shared with the other multi-process suites).
  # The checkpoint soak loops, one iteration each (scripts/soak_train_{kill,diskfull}.sh run 20).
  foreach(_soak kill diskfull)
    add_test(NAME soak_train_${_soak}.once
             COMMAND bash ${DION_TRAIN_ROOT}/scripts/soak_train_${_soak}.sh ${CMAKE_BINARY_DIR} 1)
    set_tests_properties(soak_train_${_soak}.once PROPERTIES LABELS train TIMEOUT 600 ${DION_MULTIPROCESS_TEST})
  endforeach()
  dion_train_test_binary(dion_train_parallel_tests ${DION_TRAIN_ROOT}/tests/train/parallel/test_parallel.cpp
    ${DION_TRAIN_ROOT}/tests/train/parallel/test_moe_parallel.cpp)
  gtest_discover_tests(dion_train_parallel_tests
    WORKING_DIRECTORY ${DION_TRAIN_ROOT}
    DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS train TIMEOUT 300 ${DION_MULTIPROCESS_TEST})
  # The gradient norm, grad_clip, the non-finite guard, train.py's trajectory
  # (tests/train/test_numerics.cpp; several processes per test, as the parallel suite).
  dion_train_test_binary(dion_train_numerics_tests ${DION_TRAIN_ROOT}/tests/train/test_numerics.cpp)
  gtest_discover_tests(dion_train_numerics_tests
    WORKING_DIRECTORY ${DION_TRAIN_ROOT}
    DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS train TIMEOUT 300 ${DION_MULTIPROCESS_TEST})
  # Two "hosts" as network namespaces (tests/multihost, root only; skips elsewhere with
  # "network namespaces unavailable: ..."): multi-node launch, faults, restarts. ctest -L multihost
  add_test(NAME multihost_tests
           COMMAND ${DION_PYTHON3} -m pytest -q -rs -s ${DION_TRAIN_ROOT}/tests/multihost)
  set_tests_properties(multihost_tests PROPERTIES LABELS multihost TIMEOUT 400 ${DION_MULTIPROCESS_TEST}
    ENVIRONMENT "DION_BUILD_DIR=$<TARGET_FILE_DIR:dion-train>")
  # The cut-link-then-restart loop (scripts/soak_multihost_restart.sh runs it 20 times), once.
  add_test(NAME soak_multihost_restart.once
           COMMAND bash ${DION_TRAIN_ROOT}/scripts/soak_multihost_restart.sh $<TARGET_FILE_DIR:dion-train> 1)
  set_tests_properties(soak_multihost_restart.once PROPERTIES LABELS multihost TIMEOUT 300 ${DION_MULTIPROCESS_TEST})
endif()
