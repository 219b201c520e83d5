// bench/bench_ortho.cpp — orthogonalization throughput (Google Benchmark), CPU.
//
//   bench_ortho [--sizes=256,512,1024] [--batches=1,4,16] [--shapes=square,wide]
//               [--dtypes=fp32,bf16] [--methods=newton_schulz,polar_express] [--threads=N]
//               [--clock=wall|cpu]
//               [benchmark flags: --benchmark_filter=..., --benchmark_repetitions=..., ...]
//
// What it measures: one call of dion::math::newton_schulz / polar_express (5 steps) on a batch
// G [B, m, n] already in the compute dtype, next to a plain matmul baseline of the same size
// registered just before it and run in the same process:
//   matmul/<dtype>/<m>x<n>/b<B>         the Gram product's shape [B, r, c] x [B, c, r] through
//                                       at::bmm on contiguous operands made before timing
//                                       (at::matmul with a transposed 3-D operand takes a path
//                                       3x slower: bench/matmul_paths.py), 2 r^2 c flops
//                                       (r = min(m, n), c = max).
//   <method>/<dtype>/<m>x<n>/b<B>       the orthogonalizer, with counters
//     GFLOP/s   flops of 5 iterations / time; per iteration X X^T 2 r^2 c, A A 2 r^3,
//               B X 2 r^2 c, elementwise 3 r^2 + 2 r c (normalization not counted);
//     x_matmul  its time / the baseline's time (absent when the baseline was filtered out).
// Shapes for a size s: square s x s, wide (1:4) s/4 x s, tall (4:1) s x s/4.
// LibTorch runs on --threads intra-op threads (default: the hardware threads). Time is
// wall-clock (UseRealTime) unless --clock=cpu: the process's CPU time, allowed only with
// --threads=1, where it is the work's own time even when other processes share the cores.
// Each configuration under 20 GFLOP per call gets one untimed warm-up call.
//
// What it is not: no GPU path, no accuracy check (tests/ covers the math). bench/run_ortho.sh
// builds this, runs it and prints the markdown table of docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "dion/math/ortho.h"

namespace {

// ---------------------------------------------------------------------------- grid and flags

enum class BenchShape { SQUARE, WIDE, TALL };
enum class BenchMethod { MATMUL, NEWTON_SCHULZ, POLAR_EXPRESS };

struct BenchGrid {
  std::vector<int64_t> sizes = {256, 512, 1024};
  std::vector<int64_t> batches = {1, 4, 16};
  std::vector<BenchShape> shapes = {BenchShape::SQUARE, BenchShape::WIDE};
  std::vector<at::ScalarType> dtypes = {at::kFloat, at::kBFloat16};
  std::vector<BenchMethod> methods = {BenchMethod::NEWTON_SCHULZ, BenchMethod::POLAR_EXPRESS};
  int threads = 0;         // 0: hardware threads
  bool cpu_clock = false;  // --clock=cpu
};

const char* dtype_name(at::ScalarType dtype) { return dtype == at::kFloat ? "fp32" : "bf16"; }

const char* method_name(BenchMethod method) {
  switch (method) {
    case BenchMethod::MATMUL:
      return "matmul";
    case BenchMethod::NEWTON_SCHULZ:
      return "newton_schulz";
    case BenchMethod::POLAR_EXPRESS:
      return "polar_express";
  }
  return "?";
}

// Parses our flags with CLI11 (a bad value is a usage error naming the flag: exit 2; --help
// explains each one) and leaves Google Benchmark's flags (--benchmark_*) in `rest`, in order.
// Returns the exit code to stop with, or -1 to run.
int grid_from_args(int argc, char** argv, BenchGrid* grid, std::vector<std::string>* rest) {
  CLI::App app{
      "Orthogonalization throughput on CPU: dion::math::newton_schulz / polar_express (5 steps)\n"
      "on a batch [B, m, n], each row preceded by its matmul baseline (the Gram product X X^T).",
      "bench_ortho"};
  app.allow_extras();  // Google Benchmark's flags pass through to benchmark::Initialize
  app.footer(
      "Shapes for a size s: square s x s, wide s/4 x s (1:4), tall s x s/4 (4:1).\n"
      "Google Benchmark's own flags pass through, e.g. --benchmark_filter=REGEX,\n"
      "--benchmark_repetitions=N, --benchmark_format=json (--benchmark_list_tests lists the rows).");
  const std::map<std::string, BenchShape> shapes = {
      {"square", BenchShape::SQUARE}, {"wide", BenchShape::WIDE}, {"tall", BenchShape::TALL}};
  const std::map<std::string, at::ScalarType> dtypes = {{"fp32", at::kFloat}, {"bf16", at::kBFloat16}};
  const std::map<std::string, BenchMethod> methods = {{"newton_schulz", BenchMethod::NEWTON_SCHULZ},
                                                      {"polar_express", BenchMethod::POLAR_EXPRESS}};
  std::vector<std::string> shape_names = {"square", "wide"}, dtype_names = {"fp32", "bf16"},
                           method_names = {"newton_schulz", "polar_express"};
  std::string clock = "wall";
  app.add_option("--sizes", grid->sizes, "Matrix sizes s (comma-separated, each >= 1)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--batches", grid->batches, "Batch sizes B (comma-separated, each >= 1)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--shapes", shape_names, "Shapes: square, wide, tall (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(shapes))
      ->capture_default_str();
  app.add_option("--dtypes", dtype_names, "Compute dtypes: fp32, bf16 (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(dtypes))
      ->capture_default_str();
  app.add_option("--methods", method_names, "Orthogonalizers: newton_schulz, polar_express (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(methods))
      ->capture_default_str();
  app.add_option("--threads", grid->threads, "LibTorch intra-op threads (default: the hardware threads)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--clock", clock,
                 "wall: monotonic wall time; cpu: the process's CPU time, for a machine shared "
                 "with other work (needs --threads=1)")
      ->check(CLI::IsMember({"wall", "cpu"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    grid->shapes.clear();
    for (const std::string& name : shape_names) grid->shapes.push_back(shapes.at(name));
    grid->dtypes.clear();
    for (const std::string& name : dtype_names) grid->dtypes.push_back(dtypes.at(name));
    grid->methods.clear();
    for (const std::string& name : method_names) grid->methods.push_back(methods.at(name));
    grid->cpu_clock = clock == "cpu";
    if (grid->cpu_clock && grid->threads != 1)
      throw CLI::ValidationError("--clock", "cpu sums the CPU time of all threads: pass --threads=1");
    for (int64_t s : grid->sizes)
      for (BenchShape shape : grid->shapes)
        if (shape != BenchShape::SQUARE && s % 4 != 0)
          throw CLI::ValidationError("--sizes",
                                     std::to_string(s) + " is not a multiple of 4, needed by the wide and tall shapes");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  *rest = app.remaining();
  return -1;
}

// ---------------------------------------------------------------------------- flop model

// Flops of the 5-step iteration on one [m, n] matrix (r = min(m, n), c = max(m, n)).
double ortho_flops(int64_t m, int64_t n) {
  const double r = static_cast<double>(std::min(m, n)), c = static_cast<double>(std::max(m, n));
  const double per_step = 2 * r * r * c    // Gram: X X^T
                          + 2 * r * r * r  // A A
                          + 2 * r * r * c  // B X
                          + 3 * r * r      // b A + c A^2
                          + 2 * r * c;     // a X + B X
  return 5 * per_step;
}

// Flops of the baseline Gram matmul on one [m, n] matrix.
double matmul_flops(int64_t m, int64_t n) {
  const double r = static_cast<double>(std::min(m, n)), c = static_cast<double>(std::max(m, n));
  return 2 * r * r * c;
}

// ---------------------------------------------------------------------------- benchmarks

struct BenchCase {
  BenchMethod method;
  at::ScalarType dtype;
  int64_t m, n, batch;
};

std::string case_key(const BenchCase& c) {  // shared by a case and its matmul baseline
  return std::string(dtype_name(c.dtype)) + "/" + std::to_string(c.m) + "x" + std::to_string(c.n) + "/b" +
         std::to_string(c.batch);
}

// Seconds per call of the latest run of each matmul baseline, by case_key.
std::map<std::string, double> g_matmul_seconds;
std::set<std::string> g_warmed;  // method/case_key configurations already warmed up
bool g_cpu_clock = false;        // time with the process CPU clock instead of the wall clock

// Calls above this many flops (seconds on a CPU) skip the warm-up: their first-call costs
// (allocation, oneDNN primitive creation) are small next to the call, and a 4096 x 4096
// warm-up would double the run.
constexpr double kWarmupMaxFlops = 2e10;

// Seconds on the benchmark's clock: monotonic wall time, or with --clock=cpu the process CPU
// time (Google Benchmark's own CPU column is the main thread's; with one thread they agree).
double clock_seconds() {
  timespec ts{};
  clock_gettime(g_cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

at::Tensor run_case(const BenchCase& c, const at::Tensor& G) {  // G [B, m, n]
  switch (c.method) {
    case BenchMethod::MATMUL:
      return {};  // timed in bench_case on prepared operands
    case BenchMethod::NEWTON_SCHULZ:
      return dion::math::newton_schulz(G, 1e-7, c.dtype);
    case BenchMethod::POLAR_EXPRESS:
      return dion::math::polar_express(G, 1e-6, c.dtype);
  }
  return {};
}

void bench_case(benchmark::State& state, const BenchCase& c) {
  at::manual_seed(0);
  const at::Tensor G = at::randn({c.batch, c.m, c.n}, at::TensorOptions().dtype(c.dtype));
  const std::string key = case_key(c);
  const double flops =
      static_cast<double>(c.batch) * (c.method == BenchMethod::MATMUL ? matmul_flops(c.m, c.n) : ortho_flops(c.m, c.n));
  const std::string warm_key = std::string(method_name(c.method)) + "/" + key;

  // The matmul baseline's operands: X [B, r, c] and X^T [B, c, r], both contiguous.
  const at::Tensor X = c.m <= c.n ? G : G.mT().contiguous();
  const at::Tensor Xt = X.mT().contiguous();
  auto call = [&] { return c.method == BenchMethod::MATMUL ? at::bmm(X, Xt) : run_case(c, G); };
  if (flops < kWarmupMaxFlops && g_warmed.insert(warm_key).second) benchmark::DoNotOptimize(call());
  const double start = clock_seconds();
  for (auto _ : state) {
    at::Tensor U = call();
    benchmark::DoNotOptimize(U);
  }
  const double seconds = (clock_seconds() - start) / static_cast<double>(state.iterations());

  state.counters["GFLOP/s"] = flops / seconds * 1e-9;
  if (c.method == BenchMethod::MATMUL) {
    g_matmul_seconds[key] = seconds;
  } else if (auto it = g_matmul_seconds.find(key); it != g_matmul_seconds.end()) {
    state.counters["x_matmul"] = seconds / it->second;
  }
}

void register_grid(const BenchGrid& grid) {
  for (at::ScalarType dtype : grid.dtypes)
    for (BenchShape shape : grid.shapes)
      for (int64_t s : grid.sizes)
        for (int64_t batch : grid.batches) {
          const int64_t m = shape == BenchShape::WIDE ? s / 4 : s;
          const int64_t n = shape == BenchShape::TALL ? s / 4 : s;
          std::vector<BenchMethod> methods = {BenchMethod::MATMUL};  // baseline first
          methods.insert(methods.end(), grid.methods.begin(), grid.methods.end());
          for (BenchMethod method : methods) {
            const BenchCase c{method, dtype, m, n, batch};
            const std::string name = std::string(method_name(method)) + "/" + case_key(c);
            benchmark::internal::Benchmark* b =
                benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& st) { bench_case(st, c); });
            b->Unit(benchmark::kMillisecond);
            if (!grid.cpu_clock) b->UseRealTime();
          }
        }
}

}  // namespace

// ---------------------------------------------------------------------------- main

int main(int argc, char** argv) {
  BenchGrid grid;
  std::vector<std::string> rest;
  if (const int code = grid_from_args(argc, argv, &grid, &rest); code >= 0) return code;
  if (!init_benchmark(argv[0], rest, "bench_ortho")) return 2;
  const unsigned hw = std::thread::hardware_concurrency();
  at::set_num_threads(grid.threads > 0 ? grid.threads : static_cast<int>(hw > 0 ? hw : 1));
  g_cpu_clock = grid.cpu_clock;
  register_grid(grid);

  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext("torch_threads", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("bench_clock", grid.cpu_clock ? "cpu" : "wall");
  benchmark::AddCustomContext("torch_mkl", at::hasMKL() ? "yes" : "no");
  benchmark::AddCustomContext("torch_mkldnn", at::hasMKLDNN() ? "yes" : "no");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
