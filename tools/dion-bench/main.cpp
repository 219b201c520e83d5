// tools/dion-bench — dion-cpp's benchmark program (docs/benchmarks.md).
//
//   dion-bench ortho  [--shapes 2048x2048x1,...] [--dtypes bf16,fp32] [--reps N] [--check]
//   dion-bench step   [--sets 768x2,256x4] [--algos muon,...] [--paths exact,fast,gram] [--phases]
//                     (--algos: any registered matrix algorithm, plugins in DION_ALGORITHM_PLUGINS too)
//   dion-bench micro  [--sizes 256,512,1024,2048] [--reps N]
//   dion-bench dist   [--ranks 1,2,4] [--sets 256x4] [--variants muon,dion2@0.25,...] [--layouts fsdp,ddp]
//   dion-bench all    (the four, with their defaults)
//   common: --threads N (default 1) --json FILE (append one JSON object per table)
//
// What it measures, always interleaved in one process (round r runs the variants in order,
// round r+1 in reverse) on the process CPU clock, medians reported, machine load average,
// threads and CPU flags recorded with every table:
//   ortho: each orthogonalizer path on one batch G [B, m, n] next to the same-dtype matmul
//          [B, r, c] x [B, c, r] (r = min(m, n), c = max, both operands contiguous); effective
//          rate = the reference's flops 5 (4 r^2 c + 2 r^3) per matrix / time;
//   step:  one optimizer step per algorithm and orthogonalizer path on a GPT parameter set
//          (per block q, k, v, o [d, d], up [4d, d], down [d, 4d]; embedding and lm_head
//          [8192, d] in adamw / lion groups), with bytes allocated per step (a counting CPU
//          allocator), the first step's time, and the largest difference to the exact path;
//   micro: Dion's microbenchmark: one [s, s] parameter, time per step for Muon and Dion at
//          rank s/4 and s/16;
//   dist:  the distributed step at 1, 2, 4 ranks (this program started as ranks, Gloo over
//          loopback): wall time and bytes per step per rank, and the rates that calibrate the
//          cost model (dist.h).
// The reference side (microsoft/dion eager and compiled) is bench/reference_step.py, which
// bench/dion_bench.sh runs next to this program; bench/bench_report.py writes the markdown.
//
// What it is not: a test (no timing asserts) and not a GPU benchmark.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dion/errors.h"
#include "dion/math/ortho.h"
#include "dion/optim/optimizer.h"
#include "args.h"
#include "dist.h"
#include "step.h"
#include "gpt_params.h"
#include "measure.h"

namespace {

using namespace dion::bench;  // args.h, step.h, measure.h, gpt_params.h
using dion::bench::clone_params;
using dion::bench::interleave;
using dion::bench::make_params;
using dion::bench::median;
using dion::bench::ParamSet;
using nlohmann::json;

// The shared argument helpers: args.h. The step table: step.h.

// ---------------------------------------------------------------------------- ortho

struct OrthoArgs {
  std::string shapes = "2048x2048x1,512x512x4,512x512x16,768x3072x1,3072x768x1";
  std::string dtypes = "bf16";
  int reps = 5;
  bool check = false;
};

double singular_extreme(const at::Tensor& U, bool max) {
  const at::Tensor s = at::linalg_svdvals(U.to(at::kDouble));
  return (max ? s.max() : s.min()).item<double>();
}

void run_ortho(const Common& common, const OrthoArgs& a) {
  using dion::math::OrthoMethod;
  json rows = json::array();
  // Gram NS without a dtype: fp16 where this CPU multiplies fp16 natively, else fp32 (ortho.h).
  const dion::math::CpuComputeDtype gram = dion::math::cpu_compute_dtype(at::kHalf);
  std::printf("gram: %s\n", gram.reason.c_str());
  std::printf("%-6s %-16s %9s %9s %9s %9s  %s\n", "dtype", "m x n x B", "matmul", "exact", "fast", "gram",
              "(ms; rate / matmul rate)");
  for (const std::string& dt_name : split(a.dtypes)) {
    const at::ScalarType dt = parse_dtype(dt_name);
    for (const std::string& shape : split(a.shapes)) {
      const auto d = parse_dims("--shapes", shape, 3);
      const int64_t m = d[0], n = d[1], B = d[2];
      const int64_t r = std::min(m, n), c = std::max(m, n);
      at::manual_seed(0);
      const auto opts = at::TensorOptions().dtype(dt);
      const at::Tensor G = at::randn({B, m, n}, opts);
      const at::Tensor X = at::randn({B, r, c}, opts), W = at::randn({B, c, r}, opts);
      at::Tensor sink;
      std::vector<std::function<void()>> fns = {
          [&] { sink = at::bmm(X, W); },
          [&] { sink = dion::math::polar_express(G, 1e-6, dt); },
          [&] { sink = dion::math::orthogonalize_fast(G, OrthoMethod::POLAR_EXPRESS, 1e-6, dt); },
          [&] { sink = dion::math::gram_newton_schulz(G, 1e-7, std::nullopt, true); },
      };
      const auto times = interleave(fns, a.reps, /*warmup=*/1);
      const double mm_flops = 2.0 * B * r * r * c;
      const double ref_flops = 5.0 * B * (4.0 * r * r * c + 2.0 * r * r * r);
      json row = {{"dtype", dt_name},
                  {"m", m},
                  {"n", n},
                  {"batch", B},
                  {"gram_dtype", dion::math::dtype_short_name(gram.dtype)}};
      const char* names[] = {"matmul", "exact", "fast", "gram"};
      double ms[4];
      for (int i = 0; i < 4; ++i) {
        const double s = median(times[static_cast<size_t>(i)]);
        ms[i] = s * 1e3;
        row[names[i]] = {{"ms", ms[i]},
                         {"gflops", (i == 0 ? mm_flops : ref_flops) / s * 1e-9},
                         {"reps_ms", times[static_cast<size_t>(i)]}};
      }
      const double mm_rate = mm_flops / ms[0];
      for (int i = 1; i < 4; ++i) row[names[i]]["x_matmul_rate"] = ref_flops / ms[i] / mm_rate;
      if (a.check) {  // orthogonality and distance to the exact path, on the first matrix
        const at::Tensor ex = dion::math::polar_express(G[0], 1e-6, dt).to(at::kDouble);
        for (int i = 1; i < 4; ++i) {
          at::Tensor U = i == 1 ? ex
                                : (i == 2 ? dion::math::orthogonalize_fast(G[0], OrthoMethod::POLAR_EXPRESS, 1e-6, dt)
                                          : dion::math::gram_newton_schulz(G[0], 1e-7, std::nullopt, true))
                                      .to(at::kDouble);
          row[names[i]]["sv_min"] = singular_extreme(U, false);
          row[names[i]]["sv_max"] = singular_extreme(U, true);
          row[names[i]]["max_abs_diff_to_exact"] = (U - ex).abs().max().item<double>();
        }
      }
      std::printf("%-6s %-16s %9.2f %9.2f %9.2f %9.2f  exact %.2fx fast %.2fx gram %.2fx\n", dt_name.c_str(),
                  shape.c_str(), ms[0], ms[1], ms[2], ms[3], row["exact"]["x_matmul_rate"].get<double>(),
                  row["fast"]["x_matmul_rate"].get<double>(), row["gram"]["x_matmul_rate"].get<double>());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  emit(common, {{"table", "ortho"}, {"reps", a.reps}, {"rows", rows}});
}

// ---------------------------------------------------------------------------- micro

struct MicroArgs {
  std::string sizes = "256,512,1024,2048";
  int reps = 3;
};

void run_micro(const Common& common, const MicroArgs& a) {
  json rows = json::array();
  std::printf("%-6s %12s %12s %12s\n", "size", "muon ms", "dion r/4", "dion r/16");
  for (const std::string& s_text : split(a.sizes)) {
    const int64_t s = parse_dims("--sizes", s_text, 1)[0];
    at::manual_seed(0);
    const at::Tensor base = at::randn({s, s}) / std::sqrt(double(s));
    const at::Tensor grad = at::randn({s, s}) * 1e-2;
    struct Variant {
      std::string name;
      std::string algo;
      double rank_fraction;
    };
    const std::vector<Variant> variants = {
        {"muon", "muon", 1.0}, {"dion_r4", "dion", 0.25}, {"dion_r16", "dion", 1.0 / 16}};
    std::vector<std::unique_ptr<dion::Optimizer>> opts;
    std::vector<at::Tensor> keep;
    for (const Variant& v : variants) {
      at::Tensor p = base.clone();
      p.mutable_grad() = grad.clone();
      keep.push_back(p);
      dion::Options o(0.01);
      o.algorithm(v.algo).rank_fraction(v.rank_fraction);
      opts.push_back(std::make_unique<dion::Optimizer>(std::vector<dion::ParamGroup>{{{p}}}, o));
    }
    std::vector<std::function<void()>> fns;
    for (auto& o : opts) fns.push_back([&o] { o->step(); });
    const auto times = interleave(fns, a.reps, 1);
    json row = {{"size", s}};
    for (size_t i = 0; i < variants.size(); ++i) row[variants[i].name] = median(times[i]) * 1e3;
    std::printf("%-6lld %12.2f %12.2f %12.2f\n", static_cast<long long>(s), row["muon"].get<double>(),
                row["dion_r4"].get<double>(), row["dion_r16"].get<double>());
    std::fflush(stdout);
    rows.push_back(row);
  }
  emit(common, {{"table", "micro"}, {"reps", a.reps}, {"rows", rows}});
}

}  // namespace

// ---------------------------------------------------------------------------- argument check

struct DistCli {
  std::string ranks = "1,2,4";
  std::string sets = "256x4";
  std::string variants = "muon,dion2@0.25,dion2@1,dion@1/4,dion@1/16";
  std::string layouts = "fsdp,ddp";
  int reps = 5;
  std::string rank_result;  // set by run_dist for the ranks it starts
};

// The parsed `dist` arguments; throws CLI::ValidationError naming the flag.
dion::bench::DistArgs dist_args(const DistCli& c, int threads, const std::string& argv0) {
  dion::bench::DistArgs a;
  check_list("--ranks", c.ranks, {});
  for (const std::string& t : split(c.ranks)) {
    const std::optional<int64_t> w = parse_int(t);
    if (!w || *w < 1 || *w > 64)
      throw CLI::ValidationError("--ranks", "'" + t + "': world sizes are integers from 1 to 64 (e.g. 1,2,4)");
    a.ranks.push_back(static_cast<int>(*w));
  }
  check_list("--sets", c.sets, {});
  const auto sets = split(c.sets);
  if (sets.size() != 1) throw CLI::ValidationError("--sets", "'" + c.sets + "': dist takes one d x layers set");
  const auto d = parse_dims("--sets", sets[0], 2);
  a.d = d[0];
  a.layers = d[1];
  check_list("--variants", c.variants, {});
  for (const std::string& v : split(c.variants)) {
    try {
      a.variants.push_back(dion::bench::parse_dist_variant(v));
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError("--variants", e.what());
    }
  }
  check_list("--layouts", c.layouts, {"fsdp", "ddp"});
  a.layouts = split(c.layouts);
  a.reps = c.reps;
  a.threads = threads;
  a.argv_for_ranks = {
      argv0,     "--threads", std::to_string(threads), "dist", "--sets", c.sets, "--variants", c.variants, "--layouts",
      c.layouts, "--reps",    std::to_string(c.reps)};
  return a;
}

void check_args(const OrthoArgs& o, const StepArgs& s, const MicroArgs& m) {
  check_list("--shapes", o.shapes, {});
  for (const std::string& t : split(o.shapes)) parse_dims("--shapes", t, 3);
  check_list("--dtypes", o.dtypes, {"bf16", "fp32"});
  check_list("--sets", s.sets, {});
  for (const std::string& t : split(s.sets)) parse_dims("--sets", t, 2);
  std::vector<std::string> matrix;
  for (const dion::Algorithm a : dion::algorithms())
    if (a.matrix()) matrix.push_back(a.name());
  check_list("--algos", s.algos, matrix);
  check_list("--paths", s.paths, {"exact", "fast", "gram"});
  check_list("--sizes", m.sizes, {});
  for (const std::string& t : split(m.sizes)) parse_dims("--sizes", t, 1);
}

// ---------------------------------------------------------------------------- main

int main(int argc, char** argv) {
  CLI::App app{
      "dion-bench: orthogonalizers vs matmul, optimizer steps, Dion's microbenchmark, the "
      "distributed step (CPU; interleaved repetitions, process CPU time, medians)"};
  app.require_subcommand(1);
  Common common;
  app.add_option("--threads", common.threads, "intra-op threads (1: CPU time is the work's own)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--json", common.json_path, "append one JSON object per table to this file");

  OrthoArgs ortho;
  CLI::App* c_ortho = app.add_subcommand("ortho", "orthogonalizer paths vs the same-dtype matmul");
  c_ortho->add_option("--shapes", ortho.shapes, "m x n x batch list")->capture_default_str();
  c_ortho->add_option("--dtypes", ortho.dtypes, "bf16,fp32")->capture_default_str();
  c_ortho->add_option("--reps", ortho.reps, "timed repetitions")->check(CLI::Range(1, 1 << 30));
  c_ortho->add_flag("--check", ortho.check, "singular-value band and difference to the exact path");

  StepArgs step;
  CLI::App* c_step = app.add_subcommand("step", "optimizer step per algorithm and orthogonalizer path");
  c_step->add_option("--sets", step.sets, "d x layers list of GPT parameter sets")->capture_default_str();
  c_step->add_option("--algos", step.algos, "matrix algorithms (default: every registered one)")->capture_default_str();
  c_step->add_option("--paths", step.paths, "exact,fast,gram (the first is the diff baseline)")->capture_default_str();
  c_step->add_option("--reps", step.reps, "timed steps")->check(CLI::Range(1, 1 << 30));
  c_step->add_option("--vocab", step.vocab, "embedding / lm_head rows")->check(CLI::Range(1, 1 << 30));
  c_step->add_flag("--phases", step.phases, "one more step per variant: CPU ms per library phase (dion::* scopes)");

  MicroArgs micro;
  CLI::App* c_micro = app.add_subcommand("micro", "Dion's microbenchmark: step time vs matrix size");
  c_micro->add_option("--sizes", micro.sizes, "matrix sizes")->capture_default_str();
  c_micro->add_option("--reps", micro.reps, "timed steps")->check(CLI::Range(1, 1 << 30));

  DistCli dist;
  CLI::App* c_dist =
      app.add_subcommand("dist",
                         "distributed step at 1, 2, 4 ranks (Gloo over loopback, this program as the ranks): time and "
                         "bytes per step per rank, and the cost model's calibration (matmul and link rates)");
  c_dist->add_option("--ranks", dist.ranks, "world sizes (1: one process, no Distribution)")->capture_default_str();
  c_dist->add_option("--sets", dist.sets, "one d x layers GPT parameter set (its block matrices)")
      ->capture_default_str();
  c_dist
      ->add_option("--variants", dist.variants,
                   "matrix algorithms: NAME (whole matrices, e.g. muon), NAME@F for one that orthogonalizes a part "
                   "of each matrix (F its fraction, a/b or decimal: dion2@0.25, dion@1/16)")
      ->capture_default_str();
  c_dist->add_option("--layouts", dist.layouts, "fsdp (rows sharded), ddp (replicated)")->capture_default_str();
  c_dist->add_option("--reps", dist.reps, "timed steps per variant")->check(CLI::Range(1, 1 << 30));
  c_dist->add_option("--rank-result", dist.rank_result, "")->group("");  // internal: run as one rank

  CLI::App* c_all = app.add_subcommand("all", "ortho, step, micro and dist with their defaults");

  try {  // --help: exit 0; a usage error names the flag: exit 2 (as every dion program)
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  dion::bench::DistArgs dargs;
  try {
    check_args(ortho, step, micro);
    dargs = dist_args(dist, common.threads, argv[0]);
  } catch (const CLI::ValidationError& e) {
    std::fprintf(stderr, "dion-bench: %s\nRun with --help for more information.\n", e.what());
    return 2;
  }
  try {
    at::set_num_threads(common.threads);
    if (c_dist->parsed() && !dist.rank_result.empty()) return dion::bench::run_dist_rank(dargs, dist.rank_result);
    dion::bench::AllocCounter::install();
    if (step.phases) dion::bench::PhaseTimer::install();  // a global callback: only when asked
    std::printf("load average %s; %d thread(s)\n", dion::bench::machine_info()["loadavg"].get<std::string>().c_str(),
                at::get_num_threads());
    if (c_ortho->parsed() || c_all->parsed()) run_ortho(common, ortho);
    if (c_step->parsed() || c_all->parsed()) run_step(common, step);
    if (c_micro->parsed() || c_all->parsed()) run_micro(common, micro);
    if (c_dist->parsed() || c_all->parsed()) emit(common, dion::bench::run_dist(dargs));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dion-bench: %s\n", dion::message_of(e).c_str());
    return 1;
  }
  return 0;
}
