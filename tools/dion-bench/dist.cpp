// `dion-bench dist`: the distributed optimizer step, time and bytes per rank (see dist.h).
#include "dist.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "dion/comm/chunks.h"
#include "dion/launch/launch.h"
#include "dion/math/ortho.h"
#include "dion/optim/algorithm.h"
#include "dion/optim/distributed.h"
#include "dion/optim/optimizer.h"
#include "algorithms.h"
#include "gpt_params.h"
#include "measure.h"

namespace dion::bench {

namespace {

using comm::Group;
using nlohmann::json;

// ---------------------------------------------------------------------------- variants

double parse_fraction(const std::string& text, const std::string& whole) {
  const auto bad = [&] {
    return std::invalid_argument("'" + whole + "': the value after '@' must be a number in (0, 1], " +
                                 "a decimal or a/b (e.g. 0.25, 1/16)");
  };
  double v = 0;
  try {
    const auto slash = text.find('/');
    size_t used = 0, used2 = 0;
    if (slash == std::string::npos) {
      v = std::stod(text, &used);
      if (used != text.size()) throw bad();
    } else {
      const std::string a = text.substr(0, slash), b = text.substr(slash + 1);
      const double num = std::stod(a, &used), den = std::stod(b, &used2);
      if (used != a.size() || used2 != b.size() || den == 0) throw bad();
      v = num / den;
    }
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (!(v > 0 && v <= 1)) throw bad();
  return v;
}

// Sets the real hyperparameter `option` (a name of the table, dion/optim/hyperparameters.h).
template <typename T, typename Setter>
void set_if_real(const std::string& option, Setter&& setter, double v) {
  if constexpr (std::is_same_v<T, double>)
    setter(v);
  else
    throw std::invalid_argument("hyperparameter '" + option + "' is not a real number");
}
void set_real(dion::Options& o, const std::string& option, double v) {
#define DION_SET_REAL(T, name, default_value, rule, doc) \
  if (option == #name)                                   \
    return set_if_real<T>(                               \
        option, [&](auto value) { o.name(value); }, v);
  DION_HYPERPARAMETERS(DION_SET_REAL)
#undef DION_SET_REAL
  throw std::invalid_argument("no hyperparameter '" + option + "'");
}

dion::Options options_of(const DistVariant& v) {
  dion::Options o(0.02);
  o.algorithm(v.algorithm).weight_decay(0.01);
  if (!v.size_option.empty()) set_real(o, v.size_option, v.size);
  return o;
}

// One optimizer over this rank's copies of the matrices, in one layout.
struct Instance {
  std::string layout;  // "single" (one process), "fsdp", "ddp"
  DistVariant variant;
  std::vector<at::Tensor> params;
  std::unique_ptr<dion::Optimizer> opt;
  json row;
};

std::unique_ptr<Instance> build(const std::vector<at::Tensor>& full, const std::string& layout, const DistVariant& v,
                                const std::shared_ptr<Group>& group) {
  auto inst = std::make_unique<Instance>();
  inst->layout = layout;
  inst->variant = v;
  std::shared_ptr<dion::Distributed> dist;
  if (layout == "fsdp") {
    dist = std::make_shared<dion::Distributed>(group);
    for (const at::Tensor& p : full) {
      at::Tensor local = comm::shard_tensor(p.detach(), 0, group->size(), group->rank());
      local.mutable_grad() = comm::shard_tensor(p.grad(), 0, group->size(), group->rank());
      inst->params.push_back(local);
      dist->shard(local, p.sizes().vec(), 0);
    }
  } else {
    inst->params = clone_params(full);
    // DDP: legacy Dion synchronizes over the replicas itself (compressed P and R below rank
    // fraction 1); Muon and Dion2 take the gradients as synchronized and split the megabatches.
    if (layout == "ddp")
      dist = std::make_shared<dion::Distributed>(group, bench_entry(v.algorithm).optimizer_grad_sync);
  }
  at::manual_seed(1234);  // the same initial Q (legacy Dion) on every rank
  inst->opt = std::make_unique<dion::Optimizer>(inst->params, options_of(v), math::OrthoConfig{}, dist);
  inst->opt->init_state();
  inst->row = {{"layout", layout},
               {"variant", v.name},
               {"algo", v.algorithm},
               {"fraction", v.size_option == "fraction" ? v.size : 1.0},
               {"rank_fraction", v.size_option == "rank_fraction" ? v.size : 1.0}};
  return inst;
}

// ---------------------------------------------------------------------------- helpers

void barrier(const std::shared_ptr<Group>& g) {
  if (g) g->barrier();
}

// Per-rank values [n] -> [world, n] on every rank (the values themselves with one rank).
at::Tensor gather_all(const std::shared_ptr<Group>& g, const std::vector<double>& v) {
  at::Tensor t = at::tensor(v, at::TensorOptions().dtype(at::kDouble));
  return g ? g->all_gather(t) : t.unsqueeze(0);
}

// The calibration probes of the cost model: plain work of known size, timed in the same
// interleaved rounds as the steps (so that the machine's load, shared with other processes,
// hits both alike). Each repetition lasts tens of ms at d = 256.
struct Probe {
  std::string name;  // matmul_bf16, matmul_fp32, elementwise, link
  std::string kind;  // link: all_to_all, all_reduce, all_gather
  double work = 0;   // flops (matmul), bytes read + written (elementwise), payload bytes (link)
  std::function<void()> run;
};

std::vector<Probe> make_probes(const std::shared_ptr<Group>& g, int64_t d, int64_t elements) {
  std::vector<Probe> probes;
  const int64_t B = 4, r = d, c = 4 * d;  // the MLP matrices' Gram product [B, r, c] x [B, c, r]
  const int inner = static_cast<int>(std::clamp<double>(std::round(32.0 * std::pow(256.0 / double(d), 3)), 1, 64));
  {  // bf16: the Gram product of the MLP megabatch, [B, d, 4d] x [B, 4d, d]
    at::manual_seed(0);
    const at::Tensor X = at::randn({B, r, c}).to(at::kBFloat16), W = at::randn({B, c, r}).to(at::kBFloat16);
    at::Tensor out = at::empty({B, r, r}, X.options());
    probes.push_back({"matmul_bf16", "", 2.0 * B * r * r * c * inner, [X, W, out, n = inner]() mutable {
                        for (int i = 0; i < n; ++i) at::bmm_out(out, X, W);
                      }});
  }
  {  // fp32: legacy Dion's P = M Q at rank d/4, [B, 4d, d] x [B, d, d/4]
    const int64_t k = std::max<int64_t>(1, d / 4);
    const at::Tensor M = at::randn({B, c, r}), Q = at::randn({B, r, k});
    at::Tensor out = at::empty({B, c, k});
    const int n = std::max(1, inner / 2);
    probes.push_back({"matmul_fp32", "", 2.0 * B * c * r * k * n, [M, Q, out, n]() mutable {
                        for (int i = 0; i < n; ++i) at::bmm_out(out, M, Q);
                      }});
  }
  {  // the orthogonalizer itself (exact Polar Express, bf16) on the MLP megabatch [B, d, 4d];
     // work: the reference's flops 5 (4 r^2 c + 2 r^3) per matrix
    const at::Tensor G = at::randn({B, r, c}).to(at::kBFloat16);
    const int n = std::max(1, inner / 16);
    const double flops = 5.0 * B * (4.0 * r * r * c + 2.0 * r * r * r) * n;
    probes.push_back({"ortho_bf16", "", flops, [G, n] {
                        for (int i = 0; i < n; ++i) (void)math::polar_express(G, 1e-6, at::kBFloat16);
                      }});
  }
  {  // z = x + y over fp32 tensors of the rank's parameter count: 12 bytes per element
    const at::Tensor x = at::ones({elements}), y = at::ones({elements});
    at::Tensor z = at::empty({elements});
    const int calls = 8;
    probes.push_back({"elementwise", "", 12.0 * double(elements) * calls, [x, y, z]() mutable {
                        for (int i = 0; i < calls; ++i) at::add_out(z, x, y);
                      }});
  }
  if (!g) return probes;
  const int64_t W = g->size();
  for (const char* kind : {"all_to_all", "all_reduce", "all_gather"})
    for (int64_t bytes : {int64_t(4096), int64_t(8) << 20}) {  // 4 KiB: latency; 8 MiB: bandwidth
      at::Tensor x = at::ones({bytes / 4 / W * W}, at::TensorOptions().dtype(at::kFloat));
      const std::string k = kind;
      probes.push_back({"link", k, double(x.numel() * 4), [g, x, k]() mutable {
                          if (k == "all_to_all")
                            (void)g->all_to_all(x);
                          else if (k == "all_reduce")
                            g->all_reduce_(x);
                          else
                            (void)g->all_gather(x);
                        }});
    }
  return probes;
}

// Per item, the slowest rank's wall seconds of each repetition ([reps] per item).
std::vector<std::vector<double>> slowest_ranks(const std::shared_ptr<Group>& g,
                                               const std::vector<std::vector<double>>& mine) {
  std::vector<std::vector<double>> out;
  for (const auto& v : mine) {
    const at::Tensor slowest = std::get<0>(gather_all(g, v).max(0)).contiguous();
    out.emplace_back(slowest.data_ptr<double>(), slowest.data_ptr<double>() + slowest.numel());
  }
  return out;
}

// Every variant of `args` on this world (g: null for one process): the rows and calibration.
json measure_world(const std::shared_ptr<Group>& g, const DistArgs& args) {
  const int W = g ? g->size() : 1, rank = g ? g->rank() : 0;
  at::manual_seed(0);
  const ParamSet set = make_params(args.d, args.layers, 8);
  std::vector<std::unique_ptr<Instance>> insts;
  for (const std::string& layout : (W == 1 ? std::vector<std::string>{"single"} : args.layouts))
    for (const DistVariant& v : args.variants) insts.push_back(build(set.matrices, layout, v, g));

  for (auto& in : insts) {  // first step (state, agreement check, shard-spec check) ...
    barrier(g);
    const double t0 = wall_seconds();
    in->opt->step();
    in->row["first_ms"] = (wall_seconds() - t0) * 1e3;
  }
  for (auto& in : insts) {  // ... then one steady step's bytes, per collective kind
    if (g) g->stats().clear();
    in->opt->step();
    json bytes = json::object(), calls = json::object();
    int64_t total = 0;
    if (g)
      for (const auto& [kind, e] : g->stats().by_kind) {
        bytes[kind] = e.bytes;
        calls[kind] = e.calls;
        total += e.bytes;
      }
    in->row["bytes"] = bytes;
    in->row["calls"] = calls;
    const at::Tensor totals = gather_all(g, {static_cast<double>(total)});
    std::vector<int64_t> per_rank;
    for (int64_t i = 0; i < totals.size(0); ++i) per_rank.push_back(static_cast<int64_t>(totals[i][0].item<double>()));
    in->row["bytes_per_rank"] = per_rank;
  }

  // Timed: the steps and the probes, interleaved (round r in order, r + 1 reversed), a barrier
  // before each; one untimed round first.
  int64_t elements = 0;  // this rank's parameter elements in the fsdp layout (all of them at W = 1)
  for (const at::Tensor& p : set.matrices) elements += (p.size(0) + W - 1) / W * p.size(1);
  std::vector<Probe> probes = make_probes(g, args.d, elements);
  std::vector<std::function<void()>> items;
  for (auto& in : insts) items.push_back([&in] { in->opt->step(); });
  for (Probe& p : probes) items.push_back(p.run);
  const size_t n = items.size();
  std::vector<std::vector<double>> wall(n), cpu(n);
  for (int round = -1; round < args.reps; ++round)
    for (size_t j = 0; j < n; ++j) {
      const size_t k = (round + 2) % 2 == 0 ? j : n - 1 - j;
      barrier(g);
      const double w0 = wall_seconds(), c0 = cpu_seconds();
      items[k]();
      if (round < 0) continue;
      cpu[k].push_back(cpu_seconds() - c0);
      wall[k].push_back(wall_seconds() - w0);
    }
  const auto slowest = slowest_ranks(g, wall);

  json rows = json::array();
  for (size_t k = 0; k < insts.size(); ++k) {
    json& row = insts[k]->row;
    row["world"] = W;
    row["wall_ms"] = median(slowest[k]) * 1e3;
    row["reps_wall_ms"] = json::array();
    for (double t : slowest[k]) row["reps_wall_ms"].push_back(t * 1e3);
    row["cpu_ms"] = median(cpu[k]) * 1e3;
    if (rank == 0) {
      std::printf("%d rank(s) %-6s %-11s step %8.2f ms wall (cpu %8.2f, first %8.2f)  bytes/rank %lld\n", W,
                  row["layout"].get<std::string>().c_str(), row["variant"].get<std::string>().c_str(),
                  row["wall_ms"].get<double>(), row["cpu_ms"].get<double>(), row["first_ms"].get<double>(),
                  static_cast<long long>(row["bytes_per_rank"][0].get<int64_t>()));
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  json cal = {{"world", W}};
  // Rates from the slowest rank's wall time ("wall") and from this rank's CPU time ("cpu").
  json links = json::array(), cpu_rates = json::object();
  for (size_t i = 0; i < probes.size(); ++i) {
    const Probe& p = probes[i];
    const double s = median(slowest[insts.size() + i]), c = median(cpu[insts.size() + i]);
    if (p.name == "link") {
      links.push_back({{"kind", p.kind}, {"bytes", p.work}, {"ms", s * 1e3}});
    } else {
      const std::string key = p.name == "elementwise" ? "elementwise_gb_per_s" : p.name + "_gflops";
      cal[key] = p.work / s * 1e-9;
      cpu_rates[key] = p.work / c * 1e-9;
    }
  }
  cal["cpu"] = cpu_rates;
  if (g) cal["links"] = links;
  return {{"rows", rows}, {"calibration", cal}};
}

}  // namespace

DistVariant parse_dist_variant(const std::string& text) {
  DistVariant v;
  v.name = text;
  const auto at_sign = text.find('@');
  const std::string name = text.substr(0, at_sign);
  const dion::Algorithm algo = dion::find_algorithm(name, /*aliases=*/true);
  if (!algo || !algo.spec().matrix)
    throw std::invalid_argument("'" + text + "': valid values are a matrix algorithm (" +
                                dion::algorithm_names(/*matrix_only=*/true) +
                                "), with '@' and a fraction in (0, 1] for those that orthogonalize a part of "
                                "each matrix (e.g. dion2@0.25, dion@1/16)");
  v.algorithm = algo.name();
  v.size_option = bench_entry(algo.name()).size_option;
  if (at_sign == std::string::npos) {
    if (!v.size_option.empty())
      throw std::invalid_argument("'" + text + "': " + name + " needs '@' and its " + v.size_option + " (e.g. " + name +
                                  "@0.25, " + name + "@1/16)");
    return v;
  }
  if (v.size_option.empty())
    throw std::invalid_argument("'" + text + "': " + name + " orthogonalizes whole matrices and takes no '@' value");
  v.size = parse_fraction(text.substr(at_sign + 1), text);
  return v;
}

json run_dist(const DistArgs& args) {
  json rows = json::array(), cal = json::array();
  for (int W : args.ranks) {
    json part;
    if (W == 1) {
      part = measure_world(nullptr, args);
    } else {
      char path[] = "/tmp/dion_bench_dist.XXXXXX";
      const int fd = mkstemp(path);
      if (fd < 0) throw std::runtime_error("dist: cannot create a temporary file in /tmp");
      ::close(fd);
      launch::LaunchOptions o;
      o.nproc = W;
      o.argv = args.argv_for_ranks;
      o.argv.insert(o.argv.end(), {"--rank-result", path});
      o.name = "dion-bench dist";
      const launch::LaunchResult res = launch::launch(o);
      if (res.exit_code != 0) {
        std::remove(path);
        throw std::runtime_error("dist: the " + std::to_string(W) + "-rank run failed (rank " +
                                 std::to_string(res.first_failed_rank) + " exited " + std::to_string(res.exit_code) +
                                 "; its output is above)");
      }
      std::ifstream in(path);
      try {
        in >> part;
      } catch (const std::exception& e) {
        std::remove(path);
        throw std::runtime_error(std::string("dist: rank 0's result file was unreadable: ") + e.what());
      }
      std::remove(path);
    }
    for (const json& r : part["rows"]) rows.push_back(r);
    cal.push_back(part["calibration"]);
  }
  return {{"table", "dist"},
          {"set", std::to_string(args.d) + "x" + std::to_string(args.layers)},
          {"reps", args.reps},
          {"threads_per_rank", args.threads},
          {"hardware_threads", machine_info()["hardware_threads"]},
          {"rows", rows},
          {"calibration", cal}};
}

int run_dist_rank(const DistArgs& args, const std::string& result_path) {
  comm::GroupOptions go;
  go.timeout = std::chrono::seconds(300);
  auto g = std::make_shared<Group>(Group::init_from_env(go));
  at::set_num_threads(args.threads);
  const json part = measure_world(g, args);
  if (g->rank() == 0) {
    std::ofstream out(result_path);
    out << part.dump() << "\n";
    if (!out) throw std::runtime_error("dist: cannot write " + result_path);
  }
  g->barrier();
  return 0;
}

}  // namespace dion::bench
