// Options, Override and ParamState: validation and serialization (see dion/optim/options.h).
#include "dion/optim/options.h"

#include <torch/serialize/archive.h>

#include <algorithm>
#include <sstream>

#include "dion/errors.h"

namespace dion {

Options::Options(double lr) : lr_(lr), algorithm_(algorithms().front()) {}

const std::vector<HyperparameterInfo>& hyperparameters() {
  static const std::vector<HyperparameterInfo> list = {
#define DION_INFO(T, name, default_value, rule_object, doc) {#name, doc, (rule_object).comm},
      DION_HYPERPARAMETERS(DION_INFO)
#undef DION_INFO
  };
  return list;
}

Options& Options::algorithm(const std::string& name) {
  if (const Algorithm a = find_algorithm(name)) return algorithm(a);
  unknown_algorithm_ = name.empty() ? std::string("''") : name;
  return *this;
}

std::string Options::algorithm() const {
  if (!unknown_algorithm_.empty()) return unknown_algorithm_;
  return algorithm_ ? algorithm_.name() : std::string("none");
}

namespace {
[[noreturn]] void invalid(size_t group, const std::string& option, const std::string& value, const std::string& valid) {
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
std::string str(bool v) { return v ? "true" : "false"; }
std::string str(int64_t v) { return std::to_string(v); }
std::string str(const std::string& v) { return "'" + v + "'"; }
std::string str(const Betas& b) { return str(std::get<0>(b), std::get<1>(b)); }
std::string str(math::AdjustLR v) { return math::to_string(v); }
std::string str(const OptionalDtype& t) { return t ? std::string(c10::toString(*t)) : "None"; }
}  // namespace

std::string Options::value_string(const std::string& option) const {
#define DION_VALUE(T, name, default_value, rule, doc) \
  if (option == #name) return str(name());
  DION_HYPERPARAMETERS(DION_VALUE)
#undef DION_VALUE
  return "?";
}

void Options::validate(size_t g) const {
  if (!unknown_algorithm_.empty())
    invalid(g, "algorithm", "'" + unknown_algorithm_ + "'", "valid: " + algorithm_names());
    // Each hyperparameter's own rule (hyperparameters.h), then the algorithm's rules for values.
#define DION_VALIDATE(T, name, default_value, rule_object, doc) \
  if (!(rule_object).ok(name())) invalid(g, #name, str(name()), (rule_object).text);
  DION_HYPERPARAMETERS(DION_VALIDATE)
#undef DION_VALIDATE
  if (spec().check_options)
    if (const auto e = spec().check_options(*this)) invalid(g, e->option, value_string(e->option), e->valid);
  // Rules across fields.
  if (num_heads() > 1 && flatten())
    invalid(g, "num_heads", std::to_string(num_heads()),
            "num_heads > 1 is incompatible with flatten=true: flattening the per-head view "
            "collapses the heads back into one matrix");
  if (!split_sizes().empty()) {
    const auto& s = split_sizes();
    if (num_heads() > 1)
      invalid(g, "split_sizes", str(s),
              "incompatible with num_heads > 1: use num_heads for uniform per-head splits or "
              "split_sizes for uneven row blocks, not both");
    if (flatten()) invalid(g, "split_sizes", str(s), "incompatible with flatten=true (2-D only)");
    if (algo().matrix() && !spec().supports_split_sizes) {
      std::string which;
      for (Algorithm a : algorithms())
        if (a.spec().supports_split_sizes) which += (which.empty() ? "" : " and ") + a.name();
      throw NotImplementedError("param group " + std::to_string(g) + ": split_sizes " + str(s) +
                                " is supported only by " + which + ", not '" + algorithm() + "'");
    }
  }
}

Options Override::apply(Options o) const {
  if (algorithm) o.algorithm(*algorithm);
#define DION_APPLY(T, name, default_value, rule, doc) \
  if (name) o.name(*name);
  DION_HYPERPARAMETERS(DION_APPLY)
#undef DION_APPLY
  return o;
}

bool operator==(const Options& a, const Options& b) {
  bool same = a.algorithm_ == b.algorithm_ && a.unknown_algorithm_ == b.unknown_algorithm_ && a.step() == b.step();
#define DION_SAME(T, name, default_value, rule, doc) same = same && a.name() == b.name();
  DION_HYPERPARAMETERS(DION_SAME)
#undef DION_SAME
  return same;
}

// ---------------------------------------------------------------------------- serialization
// One key per field (its name), written and read by the field's type. Archives written before
// the table kept betas as "beta1" and "beta2": still read.
namespace {
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

template <typename T>
void write(OutputArchive& ar, const char* key, const T& v) {  // double, bool, int64_t, std::string
  ar.write(key, c10::IValue(v));
}
void write(OutputArchive& ar, const char* key, const Betas& v) {
  ar.write(key, c10::IValue(c10::List<double>({std::get<0>(v), std::get<1>(v)})));
}
void write(OutputArchive& ar, const char* key, math::AdjustLR v) { ar.write(key, c10::IValue(math::to_string(v))); }
void write(OutputArchive& ar, const char* key, const SplitSizes& v) {
  ar.write(key, c10::IValue(c10::List<int64_t>(v)));
}
void write(OutputArchive& ar, const char* key, const OptionalDtype& v) {
  ar.write(key, c10::IValue(v ? static_cast<int64_t>(*v) : int64_t{-1}));
}

template <typename T>
void read(InputArchive& ar, const char* key, T& v) {
  c10::IValue iv;
  if (ar.try_read(key, iv)) v = iv.to<T>();
}
void read(InputArchive& ar, const char* key, Betas& v) {
  c10::IValue iv;
  if (ar.try_read(key, iv)) {
    const std::vector<double> b = iv.toDoubleVector();
    TORCH_CHECK(b.size() == 2, "optimizer options: '", key, "' must hold 2 values, has ", b.size());
    v = Betas{b[0], b[1]};
    return;
  }
  double b1 = std::get<0>(v), b2 = std::get<1>(v);  // the earlier format
  read(ar, "beta1", b1);
  read(ar, "beta2", b2);
  v = Betas{b1, b2};
}
void read(InputArchive& ar, const char* key, math::AdjustLR& v) {
  c10::IValue iv;
  if (ar.try_read(key, iv)) v = math::adjust_lr_from_string(iv.toStringRef());
}
void read(InputArchive& ar, const char* key, SplitSizes& v) {
  c10::IValue iv;
  if (ar.try_read(key, iv)) v = iv.toIntVector();
}
void read(InputArchive& ar, const char* key, OptionalDtype& v) {
  c10::IValue iv;
  if (!ar.try_read(key, iv)) return;
  const int64_t code = iv.toInt();
  v = code < 0 ? std::nullopt : OptionalDtype(static_cast<at::ScalarType>(code));
}
}  // namespace

void Options::serialize(torch::serialize::OutputArchive& ar) const {
  write(ar, "algorithm", algorithm());
#define DION_WRITE(T, name, default_value, rule, doc) write(ar, #name, name());
  DION_HYPERPARAMETERS(DION_WRITE)
#undef DION_WRITE
  write(ar, "step", step());
}

void Options::serialize(torch::serialize::InputArchive& ar) {
  std::string algorithm_name = algorithm();
  read(ar, "algorithm", algorithm_name);
  algorithm(algorithm_name);
#define DION_READ(T, name, default_value, rule, doc) read(ar, #name, name##_);
  DION_HYPERPARAMETERS(DION_READ)
#undef DION_READ
  read(ar, "step", step_);
}

const at::Tensor& ParamState::get(const std::string& key) const {
  for (const auto& [k, t] : tensors_)
    if (k == key) return t;
  static const at::Tensor kNone;
  return kNone;
}

ParamState& ParamState::set(const std::string& key, at::Tensor value) {
  for (auto& [k, t] : tensors_)
    if (k == key) {
      t = std::move(value);
      return *this;
    }
  tensors_.emplace_back(key, std::move(value));
  return *this;
}

void ParamState::serialize(torch::serialize::OutputArchive& ar) const {
  // Undefined tensors are absent keys, as in LibTorch's own optimizers. The key list is written
  // too, so that any algorithm's keys read back.
  std::vector<std::string> keys;
  for (const auto& [key, t] : tensors_)
    if (t.defined()) {
      ar.write(key, t, /*is_buffer=*/true);
      keys.push_back(key);
    }
  ar.write("state_keys", c10::IValue(c10::List<std::string>(keys)));
}

void ParamState::serialize(torch::serialize::InputArchive& ar) {
  std::vector<std::string> keys = {"momentum", "variance", "variance_neuron", "Q", "step_dev"};  // earlier archives
  c10::IValue listed;
  if (ar.try_read("state_keys", listed)) {
    keys.clear();
    for (const c10::IValue& k : listed.toListRef()) keys.push_back(k.toStringRef());
  }
  for (const std::string& key : keys) {
    at::Tensor v;
    if (ar.try_read(key, v, /*is_buffer=*/true)) set(key, v);
  }
}

}  // namespace dion
