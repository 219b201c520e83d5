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
// Not here: the group's algorithm (a registered one, algorithm.h) and its step counter (state,
// not a hyperparameter), which each use handles by name; cross-field rules (num_heads with
// flatten, split_sizes with the algorithm) live in Options::validate, and an algorithm's own
// rules for a value (AlgorithmSpec::check_options) in its spec.
//
// `rule` is one of the rule objects below: a check on the value and the text of the error ("param group 0: invalid fraction = 2 (must be in
// (0, 1])"). `comm` rules mark the fields whose disagreement across ranks changes the
// collectives issued (checked across ranks).
#pragma once

#include <c10/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dion/math/lr.h"

namespace dion {

using Betas = std::tuple<double, double>;             // (beta1, beta2)
using SplitSizes = std::vector<int64_t>;              // row blocks of a fused weight
using OptionalDtype = std::optional<at::ScalarType>;  // nullopt: the parameter's dtype

// clang-format off
#define DION_HYPERPARAMETERS(X)                                                                          \
  X(double, lr, 0.01, ::dion::rule::kNonNegative, "learning rate")                                               \
  X(double, weight_decay, 0.01, ::dion::rule::kFinite, "decoupled weight decay")                            \
  X(double, mu, 0.95, ::dion::rule::kNonNegative, "momentum; the error-feedback decay where an algorithm says so")     \
  X(double, muon_beta2, 0.95, ::dion::rule::kVarianceDecay, "per-neuron variance EMA (normalized algorithms)")        \
  X(::dion::Betas, betas, (::dion::Betas{0.9, 0.95}), ::dion::rule::kBetas, "scalar algorithms: (beta1, beta2)")        \
  X(double, epsilon, 1e-8, ::dion::rule::kPositive, "orthogonalization / second-moment epsilon")                          \
  X(double, fraction, 0.25, ::dion::rule::kFractionComm, "fraction of slices selected (selecting algorithms)")         \
  X(double, ef_decay, 0.95, ::dion::rule::kNonNegative, "error-feedback decay of the selected slices")                            \
  X(::dion::math::AdjustLR, adjust_lr, ::dion::math::AdjustLR::SPECTRAL_NORM, ::dion::rule::kAny,                 \
    "learning-rate scaling by shape: spectral_norm | rms_norm | none")                                   \
  X(bool, cautious_wd, false, ::dion::rule::kAny, "weight decay only where update and weight agree in sign")      \
  X(bool, nesterov, false, ::dion::rule::kAny, "Nesterov momentum")                                  \
  X(bool, flatten, false, ::dion::rule::kComm, "3-D+ parameters as [dim0, prod(rest)]")                          \
  X(int64_t, num_heads, 0, ::dion::rule::kHeads, "0 or 1: off; > 1: orthogonalize each head's rows apart")        \
  X(::dion::SplitSizes, split_sizes, ::dion::SplitSizes{}, ::dion::rule::kSplits,                                \
    "row blocks of a fused weight, orthogonalized apart")                               \
  X(std::string, selection_scope, "local", ::dion::rule::kScope,                                                  \
    "selection on row-sharded matrices: local (per shard) | global (whole matrix)")               \
  X(std::string, selection_dim, "shorter", ::dion::rule::kSelectionDim,                                           \
    "selection on sharded matrices: shorter (as one process) | shard (the sharded dim, as the reference)")  \
  X(double, rank_fraction, 1.0, ::dion::rule::kFractionComm, "low-rank: r = rank_fraction * min(m, n)")               \
  X(int64_t, rank_multiple_of, 1, ::dion::rule::kPositiveComm, "low-rank: round r up to a multiple of this")         \
  X(double, oversample, 1.25, ::dion::rule::kOversampleComm, "low-rank: randomized-QR sketch oversampling")          \
  X(::dion::OptionalDtype, momentum_dtype, std::nullopt, ::dion::rule::kDtypeComm, "momentum dtype (low-rank)")       \
  X(::dion::OptionalDtype, Q_dtype, std::nullopt, ::dion::rule::kDtypeComm, "Q dtype (low-rank)")                     \
  X(::dion::OptionalDtype, variance_dtype, std::nullopt, ::dion::rule::kAny,                                      \
    "second-moment dtype (another than the parameter's: the unfused update)")
// clang-format on

// The rules a hyperparameter's value must follow in any group. `ok(value)`: the value is valid.
// `text` goes into the error, `comm`: the value changes which collectives run (compared across
// ranks).
//
// The ranges are the reference's: the checks of microsoft/dion's optimizer constructors,
// e.g. `if mu < 0.0: raise` (mu >= 0, mu = 1 and above accepted),
// and where a constructor checks nothing (epsilon; weight_decay, except where an algorithm's spec checks it), any value that
// works (the checks one algorithm adds, such as weight_decay >= 0, are its spec's). Refused besides, because such values cannot work (docs/errors.md lists each):
//   - NaN and +-inf in every real hyperparameter (NaN passes the reference's `x < 0` checks);
//   - muon_beta2 > 1 (the variance EMA goes negative: its square root is NaN at the first step);
//   - (in the bias-corrected second-moment algorithm's spec) beta1 = 1 and beta2 >= 1;
//   - oversample <= 0 (a sketch of no rows);
//   - epsilon <= 0 (the reference checks nothing: a zero gradient, an all-zero megabatch slice
//     or an AdamW element with zero variance then divides 0 by 0 and the weights turn NaN);
//   - and a param group is checked like the constructor's arguments (the reference checks
//     only those; torch.optim's add_param_group checks nothing).
// tests/vectors/reference_ranges.json holds the reference's rule for each option, with its line.
namespace rule {
inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct Any {
  bool comm = false;
  template <typename T>
  bool ok(const T&) const {
    return true;
  }
  const char* text = "";
};
struct Real {  // a finite number with lo <= v (lo < v when lo_open) and v <= hi
  double lo = -kInf;
  bool lo_open = false;
  double hi = kInf;
  const char* text = "must be finite";
  bool comm = false;
  bool ok(double v) const { return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi; }
};
struct BetasRule {  // each finite and >= 0
  bool ok(const Betas& b) const {
    const double b1 = std::get<0>(b), b2 = std::get<1>(b);
    return std::isfinite(b1) && std::isfinite(b2) && b1 >= 0.0 && b2 >= 0.0;
  }
  const char* text = "each must be finite and >= 0";
  bool comm = false;
};
struct Positive {
  bool ok(int64_t v) const { return v > 0; }
  const char* text = "must be > 0";
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
struct DtypeRule {  // None (the parameter's dtype) or a floating dtype: state is accumulated in it
  bool ok(const std::optional<at::ScalarType>& t) const { return !t || at::isFloatingType(*t); }
  const char* text = "must be a floating dtype (torch.float32, torch.bfloat16, torch.float16, torch.float64) or None";
  bool comm = true;
};

inline constexpr Any kAny{};
inline constexpr Any kComm{true};
inline constexpr Real kFinite{};
inline constexpr Real kNonNegative{.lo = 0.0, .text = "must be finite and >= 0"};
inline constexpr Real kPositive{.lo = 0.0, .lo_open = true, .text = "must be finite and > 0"};
inline constexpr Real kVarianceDecay{.lo = 0.0, .hi = 1.0, .text = "must be in [0, 1]"};
inline constexpr Real kFractionComm{.lo = 0.0, .lo_open = true, .hi = 1.0, .text = "must be in (0, 1]", .comm = true};
inline constexpr Real kOversampleComm{.lo = 0.0, .lo_open = true, .text = "must be finite and > 0", .comm = true};
inline constexpr BetasRule kBetas{};
inline constexpr Positive kPositiveComm{};
inline constexpr Heads kHeads{};
inline constexpr Splits kSplits{};
inline constexpr Choice kScope{"local", "global", "valid: 'local', 'global'"};
inline constexpr Choice kSelectionDim{"shorter", "shard", "valid: 'shorter', 'shard'"};
inline constexpr DtypeRule kDtypeComm{};
}  // namespace rule

// selection_scope and selection_dim as the drivers switch on them. The hyperparameters stay the
// strings users write (Options, Override, checkpoints, the Python group keys, the messages),
// checked against kScope / kSelectionDim when set; a driver parses them once, at its entry.
enum class SelectionScope {
  LOCAL,   // "local": each shard's own top-k (the reference's)
  GLOBAL,  // "global": the top-k of the whole matrix
};
enum class SelectionDim {
  SHORTER,  // "shorter": along the shorter dim, as one process
  SHARD,    // "shard": along the sharded dim, as the reference
};
// The enum of a valid value; std::invalid_argument naming the valid ones for another.
inline SelectionScope selection_scope_from(const std::string& v) {
  if (v == rule::kScope.a) return SelectionScope::LOCAL;
  if (v == rule::kScope.b) return SelectionScope::GLOBAL;
  throw std::invalid_argument("selection_scope '" + v + "': " + rule::kScope.text);
}
inline SelectionDim selection_dim_from(const std::string& v) {
  if (v == rule::kSelectionDim.a) return SelectionDim::SHORTER;
  if (v == rule::kSelectionDim.b) return SelectionDim::SHARD;
  throw std::invalid_argument("selection_dim '" + v + "': " + rule::kSelectionDim.text);
}

// One hyperparameter's name and documentation, in table order (for listings and tests).
struct HyperparameterInfo {
  const char* name;
  const char* doc;
  bool comm;  // compared across ranks (changes communication)
};
const std::vector<HyperparameterInfo>& hyperparameters();

}  // namespace dion
