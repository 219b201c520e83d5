// src/train/optimizer_entries.cpp — dion-train's table of the built-in algorithms: how the
// reference's train.py constructs each class from the config keys, and what else the trainer
// needs to know of it (dion/train/optimizer_entry.h).
#include "dion/train/optimizer_entry.h"

#include <cmath>
#include <map>
#include <mutex>

namespace dion::train {

namespace {

std::map<std::string, TrainEntry> builtin_entries() {
  std::map<std::string, TrainEntry> t;
  t["muon"] = {.options = [](Options& d, const Config& c) { d.mu(c.mu).nesterov(true).adjust_lr(c.adjust_lr); },
               .gram_newton_schulz = true,
               .reference_variants = {"muon_reference"}};
  t["normuon"] = {
      .options = [](Options& d, const Config& c) { d.mu(c.mu).muon_beta2(0.95).nesterov(true).adjust_lr(c.adjust_lr); },
      .gram_newton_schulz = false};  // train.py does not pass it to NorMuon
  t["dion2"] = {
      .options =
          [](Options& d, const Config& c) {
            d.fraction(c.ortho_fraction).ef_decay(c.mu).adjust_lr(c.adjust_lr).selection_scope(c.selection_scope);
          },
      .gram_newton_schulz = true};
  t["nordion2"] = {.options =
                       [](Options& d, const Config& c) {
                         d.fraction(c.ortho_fraction).mu(c.mu).muon_beta2(0.95).adjust_lr(c.adjust_lr);
                         d.selection_scope(c.selection_scope);
                       },
                   .gram_newton_schulz = true};
  t["dion"] = {.options =
                   [](Options& d, const Config& c) {
                     d.mu(c.mu).rank_fraction(c.ortho_fraction).oversample(c.rcqr_oversample);
                     // train.py's DionMixedPrecisionConfig(momentum, variance, Q: bf16); the variance is the
                     // scalar groups' (their momentum stays the parameter's: docs/train.md).
                     if (c.mixed_precision)
                       d.momentum_dtype(at::kBFloat16).Q_dtype(at::kBFloat16).variance_dtype(at::kBFloat16);
                   },
               .reference_variants = {"dion_reference", "dion_simple"},
               .optimizer_grad_sync = true,  // replicate_mesh_grad_sync: compressed P and R over the replicas
               .moe_refusal =
                   "legacy Dion ('dion') cannot step the MoE expert stacks "
                   "(transformer.h.*.mlp.experts.w1/w2, 3-D [n_experts, out, in]); valid: muon, normuon, "
                   "dion2, dion3 (they orthogonalize each expert's matrix), or adamw / lion"};
  // torch.optim.AdamW in train.py; Lion's betas are its class's.
  t["adamw"] = {.options = [](Options& d, const Config&) { d.betas({0.9, 0.95}); }};
  t["lion"] = {.options = [](Options& d, const Config&) { d.betas({0.9, 0.99}); },
               .lm_head_lr_scaled = true};  // the Dion paper's lm_head scale (App. D.2)
  return t;
}

struct Table {
  std::mutex mu;
  std::map<std::string, TrainEntry> entries = builtin_entries();
};
Table& table() {
  static Table t;
  return t;
}

}  // namespace

const TrainEntry* find_train_entry(const std::string& name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.entries.find(name);
  return it == t.entries.end() ? nullptr : &it->second;
}

const TrainEntry& train_entry(const std::string& name) {
  static const TrainEntry fallback{.options = [](Options& d, const Config& c) { d.mu(c.mu); }};
  const TrainEntry* e = find_train_entry(name);
  return e ? *e : fallback;
}

void register_train_entry(const std::string& name, TrainEntry entry) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.entries.insert_or_assign(name, std::move(entry));
}

double lm_head_lr_scale(const std::string& scalar_opt, int64_t model_dim) {
  const TrainEntry* e = find_train_entry(scalar_opt);
  return e && e->lm_head_lr_scaled ? 1.0 / std::sqrt(static_cast<double>(model_dim)) : 1.0;
}

}  // namespace dion::train
