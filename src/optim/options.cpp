// Options, Override and ParamState: validation and serialization (see dion/optim/options.h).
#include "dion/optim/options.h"

#include <torch/serialize/archive.h>

#include <algorithm>
#include <sstream>

#include "dion/errors.h"

namespace dion {

const std::vector<std::string>& known_algorithms() {
  static const std::vector<std::string> names = {"muon", "normuon", "dion2", "nordion2",
                                                 "dion", "adamw",   "lion"};
  return names;
}

bool is_matrix_algorithm(const std::string& a) {
  return a == "muon" || a == "normuon" || a == "dion2" || a == "nordion2" || a == "dion";
}

namespace {
[[noreturn]] void invalid(size_t group, const std::string& option, const std::string& value,
                          const std::string& valid) {
  std::ostringstream os;
  os << "param group " << group << ": invalid " << option << " = " << value << " (" << valid << ")";
  throw ValueError(os.str());
}
std::string str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
std::string str(double a, double b) {  // "(a, b)"
  std::ostringstream os;
  os << "(" << a << ", " << b << ")";
  return os.str();
}
std::string str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace

void Options::validate(size_t g) const {
  const auto& algos = known_algorithms();
  if (std::find(algos.begin(), algos.end(), algorithm()) == algos.end())
    invalid(g, "algorithm", "'" + algorithm() + "'",
            "valid: muon, normuon, dion2, nordion2, dion, adamw, lion");
  if (!(lr() >= 0.0)) invalid(g, "lr", str(lr()), "must be >= 0");
  if (!(weight_decay() >= 0.0)) invalid(g, "weight_decay", str(weight_decay()), "must be >= 0");
  // Decay factors in [0, 1), as torch.optim checks Adam's betas (1 or more never forgets or grows).
  auto decay = [](double v) { return v >= 0.0 && v < 1.0; };
  if (!decay(mu())) invalid(g, "mu", str(mu()), "must be in [0, 1)");
  if (!decay(muon_beta2())) invalid(g, "muon_beta2", str(muon_beta2()), "must be in [0, 1)");
  const auto [b1, b2] = betas();
  if (!decay(b1) || !decay(b2))
    invalid(g, "betas", str(b1, b2), "both must be in [0, 1)");
  if (!(epsilon() >= 0.0)) invalid(g, "epsilon", str(epsilon()), "must be >= 0");
  if (!(fraction() > 0.0 && fraction() <= 1.0))
    invalid(g, "fraction", str(fraction()), "must be in (0, 1]");
  if (!decay(ef_decay())) invalid(g, "ef_decay", str(ef_decay()), "must be in [0, 1)");
  if (selection_scope() != "local" && selection_scope() != "global")
    invalid(g, "selection_scope", "'" + selection_scope() + "'", "valid: 'local', 'global'");
  if (selection_dim() != "shorter" && selection_dim() != "shard")
    invalid(g, "selection_dim", "'" + selection_dim() + "'", "valid: 'shorter', 'shard'");
  if (!(rank_fraction() > 0.0 && rank_fraction() <= 1.0))
    invalid(g, "rank_fraction", str(rank_fraction()), "must be in (0, 1]");
  if (rank_multiple_of() <= 0)
    invalid(g, "rank_multiple_of", std::to_string(rank_multiple_of()), "must be > 0");
  if (!(oversample() >= 1.0)) invalid(g, "oversample", str(oversample()), "must be >= 1");
  if (num_heads() < 0) invalid(g, "num_heads", std::to_string(num_heads()), "must be a positive integer if set");
  if (num_heads() > 1 && flatten())
    invalid(g, "num_heads", std::to_string(num_heads()),
            "num_heads > 1 is incompatible with flatten=true: flattening the per-head view "
            "collapses the heads back into one matrix");
  if (!split_sizes().empty()) {
    const auto& s = split_sizes();
    if (s.size() < 2) invalid(g, "split_sizes", str(s), "need at least 2 block sizes");
    if (std::any_of(s.begin(), s.end(), [](int64_t v) { return v < 1; }))
      invalid(g, "split_sizes", str(s), "entries must be positive integers");
    if (num_heads() > 1)
      invalid(g, "split_sizes", str(s),
              "incompatible with num_heads > 1: use num_heads for uniform per-head splits or "
              "split_sizes for uneven row blocks, not both");
    if (flatten()) invalid(g, "split_sizes", str(s), "incompatible with flatten=true (2-D only)");
    if (algorithm() == "dion2" || algorithm() == "nordion2" || algorithm() == "dion")
      throw NotImplementedError("param group " + std::to_string(g) + ": split_sizes " + str(s) +
                                " is supported only by muon and normuon, not '" + algorithm() + "'");
  }
}

Options Override::apply(Options o) const {
  if (algorithm) o.algorithm(*algorithm);
  if (lr) o.lr(*lr);
  if (weight_decay) o.weight_decay(*weight_decay);
  if (mu) o.mu(*mu);
  if (muon_beta2) o.muon_beta2(*muon_beta2);
  if (betas) o.betas(*betas);
  if (epsilon) o.epsilon(*epsilon);
  if (fraction) o.fraction(*fraction);
  if (ef_decay) o.ef_decay(*ef_decay);
  if (adjust_lr) o.adjust_lr(*adjust_lr);
  if (cautious_wd) o.cautious_wd(*cautious_wd);
  if (nesterov) o.nesterov(*nesterov);
  if (flatten) o.flatten(*flatten);
  if (num_heads) o.num_heads(*num_heads);
  if (split_sizes) o.split_sizes(*split_sizes);
  if (selection_scope) o.selection_scope(*selection_scope);
  if (selection_dim) o.selection_dim(*selection_dim);
  if (rank_fraction) o.rank_fraction(*rank_fraction);
  if (rank_multiple_of) o.rank_multiple_of(*rank_multiple_of);
  return o;
}

bool operator==(const Options& a, const Options& b) {
  return a.algorithm() == b.algorithm() && a.lr() == b.lr() && a.weight_decay() == b.weight_decay() &&
         a.mu() == b.mu() && a.muon_beta2() == b.muon_beta2() && a.betas() == b.betas() &&
         a.epsilon() == b.epsilon() && a.fraction() == b.fraction() && a.ef_decay() == b.ef_decay() &&
         a.adjust_lr() == b.adjust_lr() && a.cautious_wd() == b.cautious_wd() &&
         a.nesterov() == b.nesterov() && a.flatten() == b.flatten() && a.num_heads() == b.num_heads() &&
         a.split_sizes() == b.split_sizes() && a.selection_scope() == b.selection_scope() &&
         a.selection_dim() == b.selection_dim() &&
         a.rank_fraction() == b.rank_fraction() && a.rank_multiple_of() == b.rank_multiple_of() &&
         a.oversample() == b.oversample() && a.momentum_dtype() == b.momentum_dtype() &&
         a.Q_dtype() == b.Q_dtype() && a.variance_dtype() == b.variance_dtype() && a.step() == b.step();
}

// ---------------------------------------------------------------------------- serialization
namespace {
int64_t dtype_code(const std::optional<at::ScalarType>& t) {
  return t ? static_cast<int64_t>(*t) : -1;
}
std::optional<at::ScalarType> dtype_from(int64_t code) {
  if (code < 0) return std::nullopt;
  return static_cast<at::ScalarType>(code);
}
template <typename T>
T read(torch::serialize::InputArchive& ar, const char* key, T fallback) {
  c10::IValue v;
  if (!ar.try_read(key, v)) return fallback;
  return v.to<T>();
}
}  // namespace

void Options::serialize(torch::serialize::OutputArchive& ar) const {
  ar.write("algorithm", c10::IValue(algorithm()));
  ar.write("lr", c10::IValue(lr()));
  ar.write("weight_decay", c10::IValue(weight_decay()));
  ar.write("mu", c10::IValue(mu()));
  ar.write("muon_beta2", c10::IValue(muon_beta2()));
  ar.write("beta1", c10::IValue(std::get<0>(betas())));
  ar.write("beta2", c10::IValue(std::get<1>(betas())));
  ar.write("epsilon", c10::IValue(epsilon()));
  ar.write("fraction", c10::IValue(fraction()));
  ar.write("ef_decay", c10::IValue(ef_decay()));
  ar.write("adjust_lr", c10::IValue(math::to_string(adjust_lr())));
  ar.write("cautious_wd", c10::IValue(cautious_wd()));
  ar.write("nesterov", c10::IValue(nesterov()));
  ar.write("flatten", c10::IValue(flatten()));
  ar.write("num_heads", c10::IValue(num_heads()));
  ar.write("split_sizes", c10::IValue(c10::List<int64_t>(split_sizes())));
  ar.write("selection_scope", c10::IValue(selection_scope()));
  ar.write("selection_dim", c10::IValue(selection_dim()));
  ar.write("rank_fraction", c10::IValue(rank_fraction()));
  ar.write("rank_multiple_of", c10::IValue(rank_multiple_of()));
  ar.write("oversample", c10::IValue(oversample()));
  ar.write("momentum_dtype", c10::IValue(dtype_code(momentum_dtype())));
  ar.write("Q_dtype", c10::IValue(dtype_code(Q_dtype())));
  ar.write("variance_dtype", c10::IValue(dtype_code(variance_dtype())));
  ar.write("step", c10::IValue(step()));
}

void Options::serialize(torch::serialize::InputArchive& ar) {
  algorithm(read<std::string>(ar, "algorithm", algorithm()));
  lr(read<double>(ar, "lr", lr()));
  weight_decay(read<double>(ar, "weight_decay", weight_decay()));
  mu(read<double>(ar, "mu", mu()));
  muon_beta2(read<double>(ar, "muon_beta2", muon_beta2()));
  betas(std::make_tuple(read<double>(ar, "beta1", std::get<0>(betas())),
                        read<double>(ar, "beta2", std::get<1>(betas()))));
  epsilon(read<double>(ar, "epsilon", epsilon()));
  fraction(read<double>(ar, "fraction", fraction()));
  ef_decay(read<double>(ar, "ef_decay", ef_decay()));
  adjust_lr(math::adjust_lr_from_string(read<std::string>(ar, "adjust_lr", math::to_string(adjust_lr()))));
  cautious_wd(read<bool>(ar, "cautious_wd", cautious_wd()));
  nesterov(read<bool>(ar, "nesterov", nesterov()));
  flatten(read<bool>(ar, "flatten", flatten()));
  num_heads(read<int64_t>(ar, "num_heads", num_heads()));
  {
    c10::IValue v;
    if (ar.try_read("split_sizes", v)) split_sizes(v.toIntVector());
  }
  selection_scope(read<std::string>(ar, "selection_scope", selection_scope()));
  selection_dim(read<std::string>(ar, "selection_dim", selection_dim()));
  rank_fraction(read<double>(ar, "rank_fraction", rank_fraction()));
  rank_multiple_of(read<int64_t>(ar, "rank_multiple_of", rank_multiple_of()));
  oversample(read<double>(ar, "oversample", oversample()));
  momentum_dtype(dtype_from(read<int64_t>(ar, "momentum_dtype", -1)));
  Q_dtype(dtype_from(read<int64_t>(ar, "Q_dtype", -1)));
  variance_dtype(dtype_from(read<int64_t>(ar, "variance_dtype", -1)));
  step(read<int64_t>(ar, "step", step()));
}

void ParamState::serialize(torch::serialize::OutputArchive& ar) const {
  // Undefined tensors are absent keys, as in LibTorch's own optimizers.
  const std::pair<const char*, const at::Tensor*> fields[] = {
      {"momentum", &momentum_}, {"variance", &variance_}, {"variance_neuron", &variance_neuron_},
      {"Q", &Q_},               {"step_dev", &step_dev_}};
  for (const auto& [key, t] : fields)
    if (t->defined()) ar.write(key, *t, /*is_buffer=*/true);
}

void ParamState::serialize(torch::serialize::InputArchive& ar) {
  const std::pair<const char*, at::Tensor*> fields[] = {
      {"momentum", &momentum_}, {"variance", &variance_}, {"variance_neuron", &variance_neuron_},
      {"Q", &Q_},               {"step_dev", &step_dev_}};
  for (const auto& [key, t] : fields) {
    at::Tensor v;
    if (ar.try_read(key, v, /*is_buffer=*/true)) *t = v;
  }
}

}  // namespace dion
