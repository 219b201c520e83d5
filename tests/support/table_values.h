// table_values.h — for each hyperparameter type of the table (dion/optim/hyperparameters.h), a
// valid value other than a given one, within the field's rule: what the tests that walk every
// field of the table set it to.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "dion/optim/options.h"

namespace dion::testing {

// A valid value of each hyperparameter other than `current` (by type, within the field's rule
// for every algorithm).
inline bool valid_everywhere(double v, const auto& rule) { return rule.ok(v); }
inline double other_value(double current, const auto& rule) {
  for (double v : {0.5, 0.75, 1.5, 2.0})
    if (v != current && valid_everywhere(v, rule)) return v;
  ADD_FAILURE() << "no other valid double for a table field";
  return current;
}
inline bool other_value(bool current, const auto&) { return !current; }
inline int64_t other_value(int64_t current, const auto&) { return current == 2 ? 3 : 2; }
inline std::string other_value(const std::string& current, const dion::rule::Choice& rule) {
  return current == rule.a ? rule.b : rule.a;
}
inline dion::Betas other_value(const dion::Betas& current, const auto&) {
  return current == dion::Betas{0.5, 0.6} ? dion::Betas{0.6, 0.5} : dion::Betas{0.5, 0.6};
}
inline dion::AdjustLR other_value(dion::AdjustLR current, const auto&) {
  return current == dion::AdjustLR::RMS_NORM ? dion::AdjustLR::NONE : dion::AdjustLR::RMS_NORM;
}
inline dion::SplitSizes other_value(const dion::SplitSizes& current, const auto&) {
  return current == dion::SplitSizes{4, 4} ? dion::SplitSizes{2, 6} : dion::SplitSizes{4, 4};
}
inline dion::OptionalDtype other_value(const dion::OptionalDtype& current, const auto&) {
  return current == at::kBFloat16 ? dion::OptionalDtype(at::kHalf) : dion::OptionalDtype(at::kBFloat16);
}

}  // namespace dion::testing
