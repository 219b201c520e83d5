// The reference's ranges through the C++ API: the rows of tests/vectors/reference_ranges.json whose
// option is a hyperparameter of the table (dion/optim/hyperparameters.h), set on a named
// optimizer's defaults (its constructor's arguments) and on a param group (Override).
//
// What this pins: Options::validate agrees with the table's Python side
// (tests/python/test_ranges.py, which also holds the reference's rules with citations):
// "accepted" values construct, step once and keep the weights finite; "refused" and "extra"
// values (extra: the reference accepts them, they cannot work, docs/errors.md) throw
// dion::ValueError when the optimizer or the group is built. Python-only options (adjust_lr
// strings, num_heads / split_sizes as Python values, the group's algorithm, power_iters,
// qr_method) are test_ranges.py's alone.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dion/dion.h"

namespace {

using nlohmann::json;
using Groups = std::vector<dion::ParamGroup>;

json table() {
  std::ifstream in(std::string(DION_SOURCE_DIR) + "/tests/vectors/reference_ranges.json");
  EXPECT_TRUE(in.good()) << "tests/vectors/reference_ranges.json not found";
  return json::parse(in);
}

// A number, or "nan" / "inf" / "-inf" (the table's spelling of those floats).
bool as_real(const json& v, double& out) {
  if (v.is_number()) {
    out = v.get<double>();
    return true;
  }
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  const double inf = std::numeric_limits<double>::infinity();
  if (s == "nan")
    out = std::nan("");
  else if (s == "inf")
    out = inf;
  else if (s == "-inf")
    out = -inf;
  else
    return false;
  return true;
}

// Sets `option` to `v` on the defaults `o` and / or the group `ov`; false when the option is not
// a table hyperparameter or `v` is a Python-only value (a pair of the wrong length, None, ...).
bool apply(const std::string& option, const json& v, dion::Options* o, dion::Override* ov) {
  double x = 0.0;
#define REAL_FIELD(key, field)        \
  if (option == key) {                \
    if (!as_real(v, x)) return false; \
    if (o) o->field(x);               \
    if (ov) ov->field = x;            \
    return true;                      \
  }
  REAL_FIELD("lr", lr)
  REAL_FIELD("mu", mu)
  REAL_FIELD("ef_decay", ef_decay)
  REAL_FIELD("muon_beta2", muon_beta2)
  REAL_FIELD("weight_decay", weight_decay)
  REAL_FIELD("epsilon", epsilon)
  REAL_FIELD("fraction", fraction)
  REAL_FIELD("rank_fraction", rank_fraction)
  REAL_FIELD("rcqr_oversample", oversample)
#undef REAL_FIELD
  dion::Betas betas = dion::Options().betas();
  if (option == "betas") {
    double b1 = 0.0, b2 = 0.0;
    if (!v.is_array() || v.size() != 2 || !as_real(v[0], b1) || !as_real(v[1], b2)) return false;
    betas = {b1, b2};
  } else if (option == "beta1" || option == "beta2") {
    if (!as_real(v, x)) return false;
    (option == "beta1" ? std::get<0>(betas) : std::get<1>(betas)) = x;
  } else if (option == "rank_multiple_of") {
    if (!v.is_number_integer()) return false;  // a float is refused by the Python edge
    if (o) o->rank_multiple_of(v.get<int64_t>());
    if (ov) ov->rank_multiple_of = v.get<int64_t>();
    return true;
  } else if (option == "selection_scope") {
    if (!v.is_string()) return false;
    if (o) o->selection_scope(v.get<std::string>());
    if (ov) ov->selection_scope = v.get<std::string>();
    return true;
  } else {
    return false;
  }
  if (o) o->betas(betas);
  if (ov) ov->betas = betas;
  return true;
}

dion::Options defaults_of(const std::string& cls) {
  if (cls == "Muon") return dion::Muon::defaults();
  if (cls == "NorMuon") return dion::NorMuon::defaults();
  if (cls == "Dion2") return dion::Dion2::defaults();
  if (cls == "NorDion2") return dion::NorDion2::defaults();
  return dion::Dion::defaults();
}

std::unique_ptr<dion::Optimizer> make(const std::string& cls, const Groups& groups, const dion::Options& d) {
  if (cls == "Muon") return std::make_unique<dion::Muon>(groups, d);
  if (cls == "NorMuon") return std::make_unique<dion::NorMuon>(groups, d);
  if (cls == "Dion2") return std::make_unique<dion::Dion2>(groups, d);
  if (cls == "NorDion2") return std::make_unique<dion::NorDion2>(groups, d);
  return std::make_unique<dion::Dion>(groups, d);
}

// Builds the optimizer (value on the defaults, or in a group) and, when it is accepted, steps
// once. Returns whether it was accepted; a non-finite weight after the step is a failure.
bool accepted(const std::string& cls, const json& row, const json& v, bool in_group, bool& applicable) {
  at::manual_seed(0);
  at::Tensor W = at::randn({8, 4}), b = at::randn({8});
  W.mutable_grad() = at::randn({8, 4});
  b.mutable_grad() = at::randn({8});
  const std::string option = row["option"].get<std::string>();
  dion::Options d = defaults_of(cls);
  dion::Override ov;
  applicable = apply(option, v, in_group ? nullptr : &d, in_group ? &ov : nullptr);
  if (!applicable) return false;
  Groups groups;
  if (row.contains("group_algorithm")) {
    ov.algorithm = row["group_algorithm"].get<std::string>();
    groups = {{{W}}, {{b}, ov}};
  } else {
    groups = {{{W}, ov}};
  }
  std::unique_ptr<dion::Optimizer> opt;
  try {
    opt = make(cls, groups, d);
  } catch (const dion::ValueError&) {
    return false;
  }
  opt->step();
  EXPECT_TRUE(at::isfinite(W).all().item<bool>() && at::isfinite(b).all().item<bool>())
      << "an accepted value gave non-finite weights";
  return true;
}

TEST(ReferenceRanges, TableRowsThroughOptions) {
  const json t = table();
  int checked = 0;
  for (size_t i = 0; i < t["rows"].size(); ++i) {
    const json& row = t["rows"][i];
    if (row["option"].is_null()) continue;
    const bool group_only = row.value("group", false);
    for (const auto& [cls, cite] : row["classes"].items()) {
      for (const char* outcome : {"accepted", "refused", "extra"}) {
        for (const json& v : row[outcome]) {
          for (const bool in_group : {false, true}) {
            if (group_only && !in_group) continue;
            if (!group_only && in_group && row["group_key"].is_null()) continue;
            SCOPED_TRACE("row " + std::to_string(i) + ": " + row["option"].get<std::string>() + " = " + v.dump() +
                         " in " + cls + (in_group ? " (a group)" : " (the defaults)") + ", " + outcome + "; " +
                         cite.get<std::string>());
            bool applicable = false;
            const bool ok = accepted(cls, row, v, in_group, applicable);
            if (!applicable) continue;
            ++checked;
            EXPECT_EQ(ok, std::string(outcome) == "accepted");
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 250) << "the table's hyperparameter rows were not found";
}

// dion2 with ef_decay = 1: the selected slices keep their momentum (M = G after one step).
TEST(ReferenceRanges, Dion2EfDecayOfOneKeepsTheSelectedSlices) {
  at::manual_seed(0);
  at::Tensor W = at::randn({8, 16});
  const at::Tensor G = at::randn({8, 16});
  W.mutable_grad() = G.clone();
  dion::Dion2 opt(Groups{{{W}}}, dion::Dion2::defaults().ef_decay(1.0).fraction(0.5));
  opt.step();
  EXPECT_TRUE(at::equal(opt.state_of(W)->momentum(), G));
}

}  // namespace
