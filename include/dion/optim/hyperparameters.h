// dion/optim/hyperparameters.h — every hyperparameter of a param group, declared once.
//
// DION_HYPERPARAMETERS(X) calls X(type, name, default, rule, doc) for each hyperparameter, in
// declaration order. Everything that lists hyperparameters is generated from it:
//   Options' fields and chainable setters (options.h), Override's fields and Override::apply,
//   operator==, both serializers, Options::validate (each field's `rule`), the cross-rank
//   agreement description of the fields that change communication (src/optim/agreement.cpp),
//   and the Python bindings' keyword / param-group handling (python/bindings.cpp).
// Adding a hyperparameter is one line here plus its use in a driver (src/optim/drivers/).
//
// Not here: the group's algorithm (an enum with a string API, options.h) and its step counter
// (state, not a hyperparameter), which each use handles by name; cross-field rules (num_heads
// with flatten, split_sizes with the algorithm) live in Options::validate.
//
// `rule` is one of the rule objects below: a check on the value and the text of the error
// ("param group 0: invalid fraction = 2 (must be in (0, 1])"). `comm` rules mark the fields
// whose disagreement across ranks changes the collectives issued (checked across ranks).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dion/math/lr.h"

namespace dion {

using Betas = std::tuple<double, double>;         // (beta1, beta2)
using SplitSizes = std::vector<int64_t>;          // row blocks of a fused weight
using OptionalDtype = std::optional<at::ScalarType>;  // nullopt: the parameter's dtype

// clang-format off
#define DION_HYPERPARAMETERS(X)                                                                          \
  X(double, lr, 0.01, ::dion::rule::kNonNegative, "learning rate")                                               \
  X(double, weight_decay, 0.01, ::dion::rule::kNonNegative, "decoupled weight decay")                            \
  X(double, mu, 0.95, ::dion::rule::kDecay, "momentum (muon family); error-feedback decay (nordion2)")           \
  X(double, muon_beta2, 0.95, ::dion::rule::kDecay, "normuon / nordion2: per-neuron variance EMA")                \
  X(::dion::Betas, betas, (::dion::Betas{0.9, 0.95}), ::dion::rule::kBetas, "adamw / lion (beta1, beta2)")        \
  X(double, epsilon, 1e-8, ::dion::rule::kNonNegative, "orthogonalization / adamw epsilon")                       \
  X(double, fraction, 0.25, ::dion::rule::kFractionComm, "dion2 / nordion2: fraction of slices selected")         \
  X(double, ef_decay, 0.95, ::dion::rule::kDecay, "dion2: error-feedback decay")                                  \
  X(::dion::math::AdjustLR, adjust_lr, ::dion::math::AdjustLR::SPECTRAL_NORM, ::dion::rule::kAny,                 \
    "learning-rate scaling by shape: spectral_norm | rms_norm | none")                                   \
  X(bool, cautious_wd, false, ::dion::rule::kAny, "weight decay only where update and weight agree in sign")      \
  X(bool, nesterov, false, ::dion::rule::kAny, "muon family: Nesterov momentum")                                  \
  X(bool, flatten, false, ::dion::rule::kComm, "3-D+ parameters as [dim0, prod(rest)]")                          \
  X(int64_t, num_heads, 0, ::dion::rule::kHeads, "0 or 1: off; > 1: orthogonalize each head's rows apart")        \
  X(::dion::SplitSizes, split_sizes, ::dion::SplitSizes{}, ::dion::rule::kSplits,                                \
    "muon / normuon: row blocks of a fused weight, orthogonalized apart")                               \
  X(std::string, selection_scope, "local", ::dion::rule::kScope,                                                  \
    "dion2 / nordion2 on row-sharded matrices: local (per shard) | global (whole matrix)")               \
  X(std::string, selection_dim, "shorter", ::dion::rule::kSelectionDim,                                           \
    "dion2 on sharded matrices: shorter (as one process) | shard (the sharded dim, as the reference)")  \
  X(double, rank_fraction, 1.0, ::dion::rule::kFractionComm, "dion: r = rank_fraction * min(m, n)")               \
  X(int64_t, rank_multiple_of, 1, ::dion::rule::kPositiveComm, "dion: round r up to a multiple of this")         \
  X(double, oversample, 1.25, ::dion::rule::kAtLeastOneComm, "dion: randomized-QR sketch oversampling")          \
  X(::dion::OptionalDtype, momentum_dtype, std::nullopt, ::dion::rule::kDtypeComm, "dion: momentum dtype")       \
  X(::dion::OptionalDtype, Q_dtype, std::nullopt, ::dion::rule::kDtypeComm, "dion: Q dtype")                     \
  X(::dion::OptionalDtype, variance_dtype, std::nullopt, ::dion::rule::kAny,                                      \
    "adamw: variance dtype (must equal the parameter's)")
// clang-format on

// The rules a hyperparameter's value must follow. `ok` is the check, `text` goes into the
// error, `comm`: the value changes which collectives run (compared across ranks).
namespace rule {
struct Any {
  bool comm = false;
  template <typename T>
  bool ok(const T&) const { return true; }
  const char* text = "";
};
struct NonNegative {  // >= 0 (NaN refused)
  bool ok(double v) const { return v >= 0.0; }
  const char* text = "must be >= 0";
  bool comm = false;
};
struct Decay {  // [0, 1), as torch.optim checks Adam's betas
  bool ok(double v) const { return v >= 0.0 && v < 1.0; }
  const char* text = "must be in [0, 1)";
  bool comm = false;
};
struct BetasRule {
  bool ok(const Betas& b) const { return Decay{}.ok(std::get<0>(b)) && Decay{}.ok(std::get<1>(b)); }
  const char* text = "both must be in [0, 1)";
  bool comm = false;
};
struct Fraction {  // (0, 1]
  bool ok(double v) const { return v > 0.0 && v <= 1.0; }
  const char* text = "must be in (0, 1]";
  bool comm = true;
};
struct Positive {
  bool ok(int64_t v) const { return v > 0; }
  const char* text = "must be > 0";
  bool comm = true;
};
struct AtLeastOne {
  bool ok(double v) const { return v >= 1.0; }
  const char* text = "must be >= 1";
  bool comm = true;
};
struct Heads {  // 0 (and 1): off. Python: None is off, other values must be positive integers
  bool ok(int64_t v) const { return v >= 0; }
  const char* text = "must be a positive integer if set";
  bool comm = true;
};
struct Splits {  // empty (off) or >= 2 positive block sizes
  bool ok(const SplitSizes& s) const {
    if (s.empty()) return true;
    if (s.size() < 2) return false;
    for (int64_t v : s)
      if (v < 1) return false;
    return true;
  }
  const char* text = "need at least 2 block sizes, all positive integers";
  bool comm = true;
};
struct Choice {  // one of two strings
  const char* a;
  const char* b;
  bool ok(const std::string& v) const { return v == a || v == b; }
  const char* text;
  bool comm = true;
};
struct DtypeRule {
  template <typename T>
  bool ok(const T&) const { return true; }
  const char* text = "";
  bool comm = true;
};

inline constexpr Any kAny{};
inline constexpr Any kComm{true};
inline constexpr NonNegative kNonNegative{};
inline constexpr Decay kDecay{};
inline constexpr BetasRule kBetas{};
inline constexpr Fraction kFractionComm{};
inline constexpr Positive kPositiveComm{};
inline constexpr AtLeastOne kAtLeastOneComm{};
inline constexpr Heads kHeads{};
inline constexpr Splits kSplits{};
inline constexpr Choice kScope{"local", "global", "valid: 'local', 'global'"};
inline constexpr Choice kSelectionDim{"shorter", "shard", "valid: 'shorter', 'shard'"};
inline constexpr DtypeRule kDtypeComm{};
}  // namespace rule

// One hyperparameter's name and documentation, in table order (for listings and tests).
struct HyperparameterInfo {
  const char* name;
  const char* doc;
  bool comm;  // compared across ranks (changes communication)
};
const std::vector<HyperparameterInfo>& hyperparameters();

}  // namespace dion
