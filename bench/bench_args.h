// bench/bench_args.h — hands the flags a benchmark's CLI11 parse left over to Google Benchmark.
//
// Each benchmark parses its own flags with CLI11 (allow_extras) and passes what CLI11 did not
// know here: benchmark::Initialize takes its --benchmark_* flags, and anything still left (an
// unknown flag, or a --benchmark_* flag with a bad value, which Google Benchmark leaves in
// place) is a usage error naming it. Not a parser of its own: CLI11 and Google Benchmark parse.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

// Returns false (after printing the error) when an argument is left that nobody knows: the
// caller exits with 2, like CLI11's usage errors.
inline bool init_benchmark(const char* argv0, std::vector<std::string> rest, const char* name) {
  std::vector<char*> args = {const_cast<char*>(argv0)};
  for (std::string& a : rest) args.push_back(a.data());
  args.push_back(nullptr);
  int argc = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&argc, args.data());
  if (argc <= 1) return true;
  std::string unknown;
  for (int i = 1; i < argc; ++i) unknown += std::string(i > 1 ? ", " : "") + args[static_cast<size_t>(i)];
  std::fprintf(stderr,
               "%s: unrecognized argument(s): %s (a flag this benchmark does not have, or a "
               "--benchmark_* flag with a bad value); run with --help for the options\n",
               name, unknown.c_str());
  return false;
}
