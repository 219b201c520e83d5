// src/train/optimizer_catalog.cpp — what dion-train can run, and the rules its values must follow,
// from the optimizer library: the registry (dion/optim/algorithm.h) as the config sees it
// (config_keys.h, OptimizerChoice), and the hyperparameter table's rules and the algorithms' own
// for the keys that set a hyperparameter (optimizer_error). The config files themselves use no
// LibTorch; this file is their window onto the library.
#include "dion/optim/algorithm.h"
#include "dion/train/optim_setup.h"
#include "dion/train/optimizer_entry.h"
#include "config_keys.h"

#include <fmt/format.h>

#include <type_traits>

namespace dion::train::config_detail {

const std::vector<OptimizerChoice>& optimizer_catalog() {
  static const std::vector<OptimizerChoice> catalog = [] {
    std::vector<OptimizerChoice> out;
    for (const Algorithm a : algorithms()) {
      const AlgorithmSpec& s = a.spec();
      const TrainEntry& e = train_entry(s.name);
      out.push_back({.name = s.name,
                     .matrix = s.matrix,
                     .aliases = s.aliases,
                     .reference_variants = e.reference_variants,
                     .optimizer_grad_sync = e.optimizer_grad_sync,
                     .moe_refusal = e.moe_refusal});
    }
    return out;
  }();
  return catalog;
}

namespace {

// The text of the table's rule for a real value of hyperparameter `name` that `v` breaks ("" when
// it keeps it, or when the hyperparameter is not a real number).
template <typename Rule>
const char* real_rule_broken(const Rule& rule, double v) {
  if constexpr (std::is_same_v<Rule, rule::Real>)
    return rule.ok(v) ? "" : rule.text;
  else
    return "";
}
std::string table_rule_error(const std::string& name, double v) {
#define DION_RULE_OF(T, hp, default_value, rule_object, doc) \
  if (name == #hp) return real_rule_broken(rule_object, v);
  DION_HYPERPARAMETERS(DION_RULE_OF)
#undef DION_RULE_OF
  return "";
}

// An algorithm's own refusal (AlgorithmSpec::check_options) of a group, as the key that set it.
std::string spec_error(const Config& c, const Options& o, bool scalar) {
  if (!o.spec().check_options) return "";
  const auto e = o.spec().check_options(o);
  if (!e) return "";
  const std::string algorithm = scalar ? c.scalar_opt : c.optimizer;
  std::string keys_text, values;
  for (const Key& k : keys())
    if (k.scalar == scalar)
      for (const std::string& hp : k.hyperparameters)
        if (hp == e->option) {
          keys_text += (keys_text.empty() ? "'" : " / '") + std::string(k.name) + "'";
          values += (values.empty() ? "" : ", ") + value_text(c, k.field);
        }
  if (keys_text.empty())  // a hyperparameter no key sets: the class's default, as train.py constructs it
    return fmt::format("optimizer '{}' refuses its {} {} (no key sets it); valid: {}", algorithm, e->option,
                       o.value_string(e->option), e->valid);
  return fmt::format("key {}: value {} is invalid for {} '{}' (its hyperparameter {}); valid: {}", keys_text, values,
                     scalar ? "scalar_opt" : "optimizer", algorithm, e->option, e->valid);
}

}  // namespace

std::string optimizer_error(const Config& c) {
  // Every key that sets a real hyperparameter, against the table's rule for it (whatever the
  // algorithm, so that a value with no effect on this one is refused as on any other).
  for (const Key& k : keys())
    for (const std::string& hp : k.hyperparameters)
      if (const std::string broken = table_rule_error(hp, number_of(c, k.field)); !broken.empty())
        return fmt::format("key '{}': value '{}' is invalid; valid: {} (the optimizer's rule for {})", k.name,
                           value_text(c, k.field), broken, hp);
  const Algorithm algo = find_algorithm(c.optimizer, /*aliases=*/true);
  if (!algo) return "";  // the key's own check names the valid choices
  const TrainGroupOptions groups = train_group_options(c, algo.spec());
  if (std::string e = spec_error(c, groups.matrix, false); !e.empty()) return e;
  if (groups.scalar)
    if (std::string e = spec_error(c, *groups.scalar, true); !e.empty()) return e;
  // Whatever else the optimizer refuses (its rules across fields), in its own words.
  try {
    groups.matrix.validate(0);
    if (groups.scalar) groups.scalar->validate(1);
  } catch (const std::exception& e) {
    return fmt::format("the optimizer refuses this configuration (optimizer '{}', scalar_opt '{}'): {}", c.optimizer,
                       c.scalar_opt, e.what());
  }
  return "";
}

}  // namespace dion::train::config_detail
