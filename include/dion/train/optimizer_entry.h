// dion/train/optimizer_entry.h — what dion-train knows of an algorithm beyond the optimizer's
// contract (dion/optim/algorithm.h): how the reference's train.py constructs its class, and the
// trainer's own facts about it.
//
// API summary
// -----------
//   const TrainEntry& e = dion::train::train_entry("dion2");  // the built-in table, or registered
//   dion::train::find_train_entry("my_algo")                 // nullptr: it has none (the default)
//   e.options(defaults, config)  // train.py's constructor call: which config keys reach the class, how
//   dion::train::register_train_entry("my_algo", {...})       // an entry for a plugin's algorithm
//   dion::train::lm_head_lr_scale(c.scalar_opt, c.model_dim)  // the lm_head group's lr multiplier
//
// An algorithm with no entry (a plugin's) gets the default: the class's defaults with the
// config's lr, mu and weight_decay, use_gram_newton_schulz not passed, no reference variants,
// the gradients all-reduced by the trainer, lm_head at lr.
// The built-in table is src/train/optimizer_entries.cpp, keyed by the algorithm's name.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dion/optim/options.h"
#include "dion/train/config.h"

namespace dion::train {

struct TrainEntry {
  // Writes the config keys the class is built from (train.py's command line: the entry reads
  // each from the Config) into its defaults (lr and weight_decay are already set), as train.py's
  // constructor call does. Null: nothing more.
  std::function<void(Options& defaults, const Config& config)> options = {};
  bool gram_newton_schulz = false;  // train.py passes use_gram_newton_schulz to this class
  // train.py's names of variants of this algorithm that are not implemented here: the config
  // refuses them and names this one as the nearest.
  std::vector<std::string> reference_variants = {};
  // It averages the gradients over the replicas itself (the Distribution's sync_gradients;
  // legacy Dion's replicate_mesh_grad_sync): the key replicate_mesh_grad_sync is for it, and the
  // trainer then does not all-reduce them.
  bool optimizer_grad_sync = false;
  // As scalar_opt: the lm_head group's lr is scaled by 1/sqrt(model_dim) (lm_head_lr_scale).
  bool lm_head_lr_scaled = false;
  // Why it cannot step the MoE expert stacks (3-D [n_experts, out, in]): the config's refusal of
  // it with n_experts > 0, after "key 'optimizer': ". "": it can.
  std::string moe_refusal = {};
};

// The entry of the algorithm `name` (its registered name, not an alias): a registered one, else
// the built-in table's, else the default above. The reference stays valid until an entry of
// the same name is registered.
const TrainEntry& train_entry(const std::string& name);
// The registered or built-in entry of `name`; nullptr when it has none (train_entry's default).
const TrainEntry* find_train_entry(const std::string& name);
// Adds or replaces the entry of `name` (a program's own algorithm, a test's).
void register_train_entry(const std::string& name, TrainEntry entry);

// The lm_head learning-rate scale of the Dion paper (App. D.2), as the reference's
// opt_utils.lm_head_lr_scale: 1/sqrt(model_dim) for a scalar_opt whose entry asks for it
// (lm_head_lr_scaled), 1 otherwise.
double lm_head_lr_scale(const std::string& scalar_opt, int64_t model_dim);

}  // namespace dion::train
