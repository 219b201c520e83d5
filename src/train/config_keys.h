// src/train/config_keys.h — the table of dion-train's keys, shared by the files that read it
// (internal to src/train; the public API is dion/train/config.h).
//
//   config_keys.cpp   the table (one row per key) and lookups, value text, "did you mean"
//   config_io.cpp     YAML file and command line -> Config; Config -> YAML
//   config_rules.cpp  the per-key checks and the relations between keys (config_validate)
//   config_help.cpp   --help
//
// To add a key: a field in Config (config.h) with its default, and one row in the table in
// config_keys.cpp (its name, field, help line, resume rule and check); then its use (for an
// optimizer key: the entry in optimizer_entries.cpp). docs/architecture.md "How to add a config key".
#pragma once

#include "dion/train/config.h"
#include "dion/train/resume_policy.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dion::train::config_detail {

using Field = std::variant<int64_t Config::*, double Config::*, std::string Config::*, bool Config::*>;

// What values a key accepts beyond its type.
// OPTIMIZER: none of the trainer's own; the optimizer library's rules for the hyperparameters the
// key sets (`hyperparameters`), checked by optimizer_error().
enum class Check { ANY, POSITIVE, NON_NEGATIVE, RATIO, FRACTION, CHOICE, OPTIMIZER };

// What a resumed run may do with the key (dion/train/resume_policy.h), and for MUST_MATCH what
// the saved state depends on (the refusal's reason). No default: every row states it.
struct Resume {
  constexpr Resume(ResumePolicy p, const char* w = "") : policy(p), why(w) {}  // NOLINT: implicit
  ResumePolicy policy;
  const char* why;
};

struct Key {
  const char* name;
  Field field;
  const char* help;
  Resume resume;
  Check check = Check::ANY;
  std::vector<std::string> choices = {};
  // Values the reference's train.py accepts that are not implemented here -> the nearest choice.
  std::vector<std::pair<std::string, std::string>> reference_only = {};
  // Choices and reference_only from the optimizer catalog instead (the `optimizer` and
  // `scalar_opt` keys): every algorithm, or the scalar ones.
  enum class Catalog { NONE, ALL, SCALAR } catalog = Catalog::NONE;
  // The optimizer hyperparameters (dion/optim/hyperparameters.h) the key's value becomes, in the
  // matrix group or, for `scalar`, in the embedding and lm_head groups (scalar_opt).
  std::vector<std::string> hyperparameters = {};
  bool scalar = false;
};

// What dion-train can run (optimizer_catalog.cpp: the optimizer library's registry, with each
// algorithm's TrainEntry, dion/train/optimizer_entry.h). The config files use no LibTorch: a
// program with the config alone (the config fuzzer) links its own list.
struct OptimizerChoice {
  std::string name;
  bool matrix = true;
  std::vector<std::string> aliases;             // accepted names for it
  std::vector<std::string> reference_variants;  // train.py's names of variants not implemented here
  bool optimizer_grad_sync = false;             // takes replicate_mesh_grad_sync
  std::string moe_refusal = {};                 // why it cannot step the MoE expert stacks ("": it can)
};
const std::vector<OptimizerChoice>& optimizer_catalog();
const OptimizerChoice* find_optimizer(const std::string& name);  // by name or alias; nullptr: none
// The optimizer library's verdict on the values dion-train would give its hyperparameters (the
// rules of dion/optim/hyperparameters.h for every key that sets one, then the chosen algorithms'
// own, AlgorithmSpec::check_options): "" when it accepts them, else the error, naming the key,
// its value and what is valid. optimizer_catalog.cpp; the config fuzzer's stub checks nothing.
std::string optimizer_error(const Config& c);
// k.choices, or the catalog's names (with aliases) for a catalog key.
std::vector<std::string> choices_of(const Key& k);
std::vector<std::pair<std::string, std::string>> reference_only_of(const Key& k);

// Every key, in table order (the order of --help and of config.yaml).
const std::vector<Key>& keys();
// The row of `name`, nullptr when there is none.
const Key* find_key(const std::string& name);
// Every key's name, in table order.
std::vector<std::string> all_key_names();
// "a, b, c": every key's name, for messages.
std::string key_names();
// "int", "float", "string" or "bool".
const char* type_name(const Field& f);
// The shortest text that reads back as `v`, with a ".0" when it would read as an integer.
std::string format_double(double v);
// The value of a number key's field `f` in `c` (0 for a string or boolean key).
double number_of(const Config& c, const Field& f);
// The value of `f` in `c` as text (as in config.yaml, strings unquoted).
std::string value_text(const Config& c, const Field& f);
// "a, b, c".
std::string join_choices(const std::vector<std::string>& choices);
// " (did you mean 'x'?)" for the nearest of `names`, "" when none is near.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names);

}  // namespace dion::train::config_detail
