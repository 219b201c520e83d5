# cmake/DionData.cmake — the data tools: GPT-2 tokenizer, FineWeb shards, dion-data.
#
# Included by the root CMakeLists.txt after it has set C++20, ccache, the `dion_warnings`
# interface target, enable_testing() and (with DION_BUILD_TESTS) GTest + GoogleTest.
# Defines:
#   dion_data        static library (include/dion/data, src/data); no LibTorch
#   dion-data        the command-line tool (tools/dion-data)
#   dion_data_tests  GoogleTest suite (tests/data), with DION_BUILD_TESTS
#   bench_tokenizer  Google Benchmark (bench/tokenizer), with DION_BUILD_BENCH and benchmark found
#   fuzz_shard_header, fuzz_tokenizer  libFuzzer targets (tests/fuzz), with DION_FUZZ (clang)
#   fuzz_config      libFuzzer target of dion-train's config parser (src/train/config_*.cpp have
#                    no LibTorch dependency), with DION_FUZZ
#   DION_SANITIZE    option: build everything here with ASan + UBSan (scripts/sanitize.sh)
#   DION_DATA_DIR    cache path: the repository's own data/ (GPT-2 files, Tiny Shakespeare,
#                    committed with data/SHA256SUMS) that the tests read; a test that finds a
#                    file missing fails naming it
# Does not touch the optimizer library or anything torch-related.

set(DION_DATA_ROOT "${CMAKE_CURRENT_LIST_DIR}/..")
cmake_path(NORMAL_PATH DION_DATA_ROOT)
string(REGEX REPLACE "/$" "" DION_DATA_ROOT "${DION_DATA_ROOT}")
set(DION_DATA_DIR "${DION_DATA_ROOT}/data" CACHE PATH
    "The data the data tools' tests read (gpt2/, tinyshakespeare/): the repository's data/")

option(DION_SANITIZE "Build with AddressSanitizer + UndefinedBehaviorSanitizer (any error aborts)" OFF)
option(DION_FUZZ "Build the libFuzzer targets of the data library (needs clang)" OFF)
if(DION_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
if(DION_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "dion: DION_FUZZ needs clang's libFuzzer: configure with CC=clang CXX=clang++")
endif()

find_package(PkgConfig REQUIRED)
pkg_check_modules(DION_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)  # Debian: libpcre2-dev
find_package(nlohmann_json 3.10 REQUIRED)                        # nlohmann-json3-dev
find_package(CLI11 REQUIRED)                                     # libcli11-dev
find_package(fmt REQUIRED)                                       # libfmt-dev
find_package(CURL REQUIRED)                                      # libcurl4-openssl-dev
find_package(Threads REQUIRED)

# ---------------------------------------------------------------------------- library
add_library(dion_data STATIC
  ${DION_DATA_ROOT}/src/data/byte_tokenizer.cpp
  ${DION_DATA_ROOT}/src/data/document_source.cpp
  ${DION_DATA_ROOT}/src/data/download.cpp
  ${DION_DATA_ROOT}/src/data/download_attempt.cpp
  ${DION_DATA_ROOT}/src/data/file_util.cpp
  ${DION_DATA_ROOT}/src/data/prepare.cpp
  ${DION_DATA_ROOT}/src/data/shard.cpp
  ${DION_DATA_ROOT}/src/data/shard_folder.cpp
  ${DION_DATA_ROOT}/src/data/shard_set.cpp
  ${DION_DATA_ROOT}/src/data/tokenizer.cpp
  ${DION_DATA_ROOT}/src/data/tokenizer_bpe.cpp
  ${DION_DATA_ROOT}/src/data/utf8.cpp)
target_include_directories(dion_data PUBLIC ${DION_DATA_ROOT}/include)
target_link_libraries(dion_data
  PUBLIC Threads::Threads
  PRIVATE PkgConfig::DION_PCRE2 nlohmann_json::nlohmann_json fmt::fmt CURL::libcurl
          dion_warnings)

# ---------------------------------------------------------------------------- tool
add_executable(dion-data
  ${DION_DATA_ROOT}/tools/dion-data/main.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cli.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cmd_download.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cmd_encode.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cmd_finish_swap.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cmd_inspect.cpp
  ${DION_DATA_ROOT}/tools/dion-data/cmd_prepare.cpp
  ${DION_DATA_ROOT}/tools/dion-data/progress.cpp)
target_link_libraries(dion-data PRIVATE dion_data CLI11::CLI11 fmt::fmt dion_warnings)

# ---------------------------------------------------------------------------- tests
if(DION_BUILD_TESTS)
  add_executable(dion_data_tests
    ${DION_DATA_ROOT}/tests/data/http_server.cpp
    ${DION_DATA_ROOT}/tests/data/test_bytes.cpp
    ${DION_DATA_ROOT}/tests/data/test_cli.cpp
    ${DION_DATA_ROOT}/tests/data/test_download.cpp
    ${DION_DATA_ROOT}/tests/data/test_prepare.cpp
    ${DION_DATA_ROOT}/tests/data/test_prepare_safety.cpp
    ${DION_DATA_ROOT}/tests/data/test_shard.cpp
    ${DION_DATA_ROOT}/tests/data/test_tokenizer.cpp
    ${DION_DATA_ROOT}/tests/data/test_util.cpp)
  target_link_libraries(dion_data_tests PRIVATE
    dion_data GTest::gtest GTest::gtest_main nlohmann_json::nlohmann_json fmt::fmt dion_warnings)
  target_compile_definitions(dion_data_tests PRIVATE
    DION_SOURCE_DIR="${DION_DATA_ROOT}"
    DION_DATA_DIR="${DION_DATA_DIR}"
    DION_DATA_EXE="$<TARGET_FILE:dion-data>")
  add_dependencies(dion_data_tests dion-data)
  gtest_discover_tests(dion_data_tests
    WORKING_DIRECTORY ${DION_DATA_ROOT}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS data TIMEOUT 300)
endif()

# ---------------------------------------------------------------------------- fuzz targets
if(DION_FUZZ)
  # The library gets coverage instrumentation; each target gets libFuzzer's main.
  target_compile_options(dion_data PRIVATE -fsanitize=fuzzer-no-link)
  foreach(_fuzz fuzz_shard_header fuzz_tokenizer)
    add_executable(${_fuzz} ${DION_DATA_ROOT}/tests/fuzz/${_fuzz}.cpp)
    target_link_libraries(${_fuzz} PRIVATE dion_data dion_warnings)
    target_compile_options(${_fuzz} PRIVATE -fsanitize=fuzzer)
    target_link_options(${_fuzz} PRIVATE -fsanitize=fuzzer)
  endforeach()
  target_compile_definitions(fuzz_tokenizer PRIVATE DION_DATA_DIR="${DION_DATA_DIR}")
  # dion-train's config parser: src/train/config_*.cpp need yaml-cpp, CLI11 and fmt but not
  # LibTorch, so it is compiled into its fuzz target here, where the sanitizer build has no torch.
  find_package(yaml-cpp REQUIRED)  # libyaml-cpp-dev
  add_executable(fuzz_config ${DION_DATA_ROOT}/tests/fuzz/fuzz_config.cpp
                             ${DION_DATA_ROOT}/src/train/config_help.cpp
                             ${DION_DATA_ROOT}/src/train/config_io.cpp
                             ${DION_DATA_ROOT}/src/train/config_keys.cpp
                             ${DION_DATA_ROOT}/src/train/config_rules.cpp
                             ${DION_DATA_ROOT}/tests/fuzz/optimizer_catalog_stub.cpp)
  target_include_directories(fuzz_config PRIVATE ${DION_DATA_ROOT}/include)
  target_link_libraries(fuzz_config PRIVATE yaml-cpp CLI11::CLI11 fmt::fmt dion_warnings)
  target_compile_options(fuzz_config PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_config PRIVATE -fsanitize=fuzzer)
endif()

# ---------------------------------------------------------------------------- benchmark
if(DION_BUILD_BENCH)
  find_package(benchmark QUIET)  # libbenchmark-dev
  if(benchmark_FOUND)
    add_executable(bench_tokenizer ${DION_DATA_ROOT}/bench/tokenizer/bench_tokenizer.cpp)
    target_link_libraries(bench_tokenizer PRIVATE dion_data benchmark::benchmark CLI11::CLI11
                                                  dion_warnings)
    target_compile_definitions(bench_tokenizer PRIVATE
      DION_DATA_DIR="${DION_DATA_DIR}")
    if(DION_BUILD_TESTS)
      dion_add_usage_tests(PREFIX bench_tokenizer TARGET bench_tokenizer
        BAD "text_missing|--text /nonexistent/input.txt|--text"
            "tokenizer_missing|--tokenizer /nonexistent/gpt2|--tokenizer"
            "gpt2_dir_is_gone|--gpt2-dir x|--gpt2-dir"
            "benchmark_flag_value|--benchmark_repetitions=abc|--benchmark_repetitions=abc"
        HELP "--text[^\n]*\n?[^\n]*Text file.*--tokenizer[^\n]*\n?[^\n]*GPT-2 tokenizer files.*--benchmark_filter")
    endif()
  else()
    message(STATUS "dion: Google Benchmark not found; bench_tokenizer is not built")
  endif()
endif()
