// tools/dion-bench/step.cpp — `dion-bench step` (step.h).
#include "step.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <functional>

#include "dion/optim/algorithm.h"
#include "dion/optim/optimizer.h"
#include "algorithms.h"
#include "gpt_params.h"
#include "measure.h"

namespace dion::bench {

using nlohmann::json;

std::string matrix_algorithms() {
  std::string out;
  for (const dion::Algorithm a : dion::algorithms())
    if (a.matrix()) out += (out.empty() ? "" : ",") + a.name();
  return out;
}

namespace {

struct Built {
  std::unique_ptr<dion::Optimizer> opt;
  std::vector<at::Tensor> matrices;  // this optimizer's copies
};

Built build(const ParamSet& base, const std::string& algo, const std::string& path) {
  Built b;
  b.matrices = clone_params(base.matrices);
  std::vector<dion::ParamGroup> groups = {
      {b.matrices},
      {clone_params(base.adamw), {.algorithm = "adamw", .lr = 0.003}},
      {clone_params(base.lion), {.algorithm = "lion", .lr = 0.0003}},
  };
  dion::Options o(0.02);
  o.algorithm(algo).weight_decay(0.01);
  const dion::Algorithm a = dion::find_algorithm(algo);
  if (const auto set = bench_entry(a.name()).step_options) set(o);  // e.g. a low-rank algorithm's rank
  dion::math::OrthoConfig ortho;
  ortho.path = path == "exact" ? dion::math::OrthoPath::EXACT : dion::math::OrthoPath::FAST;
  ortho.use_gram_newton_schulz = path == "gram";
  at::manual_seed(1234);
  b.opt = std::make_unique<dion::Optimizer>(groups, o, ortho);
  return b;
}

}  // namespace

void run_step(const Common& common, const StepArgs& a) {
  json rows = json::array();
  const auto paths = split(a.paths);
  for (const std::string& set : split(a.sets)) {
    const auto d = parse_dims("--sets", set, 2);
    at::manual_seed(0);
    const ParamSet base = make_params(d[0], d[1], a.vocab);
    for (const std::string& algo : split(a.algos)) {
      std::vector<Built> opts;
      std::vector<std::string> names;
      for (const std::string& p : paths) {
        // An algorithm without an orthogonalizer (a QR-based one) has one path.
        if (!bench_entry(dion::find_algorithm(algo).name()).uses_orthogonalizer && p != "exact") continue;
        opts.push_back(build(base, algo, p));
        names.push_back(p);
      }
      json row = {{"set", set}, {"algo", algo}};
      // First step (includes state creation), then bytes allocated by one steady step.
      for (size_t i = 0; i < opts.size(); ++i) {
        const double t0 = dion::bench::cpu_seconds();
        opts[i].opt->step();
        row[names[i]]["first_ms"] = (dion::bench::cpu_seconds() - t0) * 1e3;
      }
      for (size_t i = 0; i < opts.size(); ++i) {
        opts[i].opt->step();  // workspaces exist after one call of each shape
        dion::bench::AllocCounter::begin();
        opts[i].opt->step();
        row[names[i]]["alloc_bytes"] = dion::bench::AllocCounter::bytes();
        row[names[i]]["alloc_calls"] = dion::bench::AllocCounter::calls();
      }
      std::vector<std::function<void()>> fns;
      for (Built& b : opts) fns.push_back([&b] { b.opt->step(); });
      const auto times = interleave(fns, a.reps, 0);
      if (a.phases) {  // one more step each, CPU ms per library phase (not part of the diff below)
        for (size_t i = 0; i < opts.size(); ++i) {
          dion::bench::PhaseTimer::begin();
          const double t0 = dion::bench::cpu_seconds();
          opts[i].opt->step();
          const double total = dion::bench::cpu_seconds() - t0;
          json phases = {{"step", total * 1e3}};
          std::printf("%-7s %-9s %-5s phases (CPU ms, nested scopes in both): step %.1f", set.c_str(), algo.c_str(),
                      names[i].c_str(), total * 1e3);
          for (const auto& [name, sec] : dion::bench::PhaseTimer::end()) {
            phases[name.substr(6)] = sec * 1e3;
            std::printf("  %s %.1f", name.c_str() + 6, sec * 1e3);
          }
          std::printf("\n");
          row[names[i]]["phases_ms"] = phases;
        }
      }
      // Every optimizer has taken 3 + reps (+ 1 with --phases) steps on the same gradients:
      // compare the matrices.
      for (size_t i = 0; i < opts.size(); ++i) {
        row[names[i]]["ms"] = median(times[i]) * 1e3;
        row[names[i]]["reps_ms"] = times[i];
        double diff = 0, scale = 0;
        for (size_t k = 0; k < opts[i].matrices.size(); ++k) {
          const at::Tensor ref = opts[0].matrices[k].to(at::kDouble);
          diff = std::max(diff, (opts[i].matrices[k].to(at::kDouble) - ref).abs().max().item<double>());
          scale = std::max(scale, ref.abs().max().item<double>());
        }
        row[names[i]]["max_rel_diff_to_" + names[0]] = scale > 0 ? diff / scale : diff;
      }
      std::printf("%-7s %-9s", set.c_str(), algo.c_str());
      for (size_t i = 0; i < opts.size(); ++i)
        std::printf("  %s %8.1f ms (first %8.1f) %7.1f MiB/step", names[i].c_str(), row[names[i]]["ms"].get<double>(),
                    row[names[i]]["first_ms"].get<double>(), row[names[i]]["alloc_bytes"].get<double>() / (1 << 20));
      std::printf("\n");
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  emit(common,
       {{"table", "step"}, {"reps", a.reps}, {"peak_rss_bytes", dion::bench::peak_rss_bytes()}, {"rows", rows}});
}

}  // namespace dion::bench
