// src/train/config_keys.cpp — the table of dion-train's keys (one row per key: name, the Config
// field it sets, a help line, its resume rule, a check) and the lookups over it: find a key, its
// value as text, the nearest name for "did you mean".
//
// To add a key: a field in Config (config.h) with its default and one row in keys() below, its
// resume rule included (a row cannot leave it out: Resume has no default); then its use
// (docs/architecture.md "How to add a config key").
#include "config_keys.h"

#include <algorithm>
#include <fmt/format.h>

namespace dion::train::config_detail {

// ---------------------------------------------------------------------------- the table

namespace {
using P = ResumePolicy;
}  // namespace

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      // data
      {"data_dir", &Config::data_dir, "folder with fineweb_train_*.bin and fineweb_val_*.bin shards",
       {P::FREE, "the data's identity is checked by its fingerprint, not its path"}},
      // training
      {"batch_size", &Config::batch_size,
       "global batch size, sequences (gradient accumulation = batch_size / device_batch_size)",
       {P::MUST_MATCH, "the loader position and the token count are in global batches"}, Check::POSITIVE},
      {"device_batch_size", &Config::device_batch_size, "sequences per forward/backward pass",
       P::LOGGED, Check::POSITIVE},
      {"sequence_length", &Config::sequence_length, "tokens per sequence",
       {P::MUST_MATCH, "the model's positions and the loader position depend on it"}, Check::POSITIVE},
      {"num_iterations", &Config::num_iterations, "optimizer steps", P::LOGGED, Check::POSITIVE},
      {"warmup_ratio", &Config::warmup_ratio, "fraction of num_iterations with linear lr warmup",
       P::LOGGED, Check::RATIO},
      {"warmdown_ratio", &Config::warmdown_ratio, "fraction of num_iterations with linear lr decay to 0",
       P::LOGGED, Check::RATIO},
      // model
      {"model_dim", &Config::model_dim, "model width (divisible by n_head)",
       {P::MUST_MATCH, "the saved tensors have its shape"}, Check::POSITIVE},
      {"n_layer", &Config::n_layer, "transformer blocks",
       {P::MUST_MATCH, "the saved tensors are its layers"}, Check::POSITIVE},
      {"n_head", &Config::n_head, "attention heads",
       {P::MUST_MATCH, "the attention and the optimizer's per-head state depend on it"}, Check::POSITIVE},
      {"vocab_size", &Config::vocab_size,
       "embedding / lm_head rows: at least the data's vocabulary (GPT-2 shards 50257, byte shards 257); the reference "
       "pads 50257 to 50304",
       {P::MUST_MATCH, "the embedding and lm_head have vocab_size rows"}, Check::POSITIVE},
      {"qk_norm", &Config::qk_norm,
       "RMS-normalize q and k per head before the attention (the reference); false: as projected and rotated, the "
       "logits unbounded (what qk_clip_tau bounds)",
       {P::MUST_MATCH, "the attention computes another function without it"}},
      // mixture of experts (dion/train/moe.h)
      {"n_experts", &Config::n_experts, "routed experts per MoE layer (0: the dense MLP everywhere)",
       {P::MUST_MATCH, "the saved expert stacks have n_experts experts"}, Check::NON_NEGATIVE},
      {"top_k", &Config::top_k, "experts per token (1..n_experts)", P::LOGGED, Check::POSITIVE},
      {"expert_dim", &Config::expert_dim,
       "one expert's hidden size (0: 4 x model_dim / (top_k + n_shared_experts), the dense MLP's active size)",
       {P::MUST_MATCH, "the saved expert stacks have its shape"}, Check::NON_NEGATIVE},
      {"n_shared_experts", &Config::n_shared_experts, "always-on experts in each MoE layer",
       {P::MUST_MATCH, "the saved shared experts have its shape"}, Check::NON_NEGATIVE},
      {"moe_every", &Config::moe_every, "every N-th block is MoE (1: all)",
       {P::MUST_MATCH, "the saved layers are MoE or dense by it"}, Check::POSITIVE},
      {.name = "router_score",
       .field = &Config::router_score,
       .help = "router scores: softmax over the experts or sigmoid per expert (top_k weights renormalised)",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"softmax", "sigmoid"}},
      {"moe_bias_rate", &Config::moe_bias_rate,
       "auxiliary-loss-free balancing (DeepSeek-V3): expert bias step per optimizer step (0: off)",
       P::LOGGED, Check::NON_NEGATIVE},
      {"moe_aux_loss_coef", &Config::moe_aux_loss_coef, "sequence-wise balance loss coefficient (0: off)",
       P::LOGGED, Check::NON_NEGATIVE},
      {.name = "router_opt",
       .field = &Config::router_opt,
       .help = "optimizer of the routers: scalar (scalar_opt at lr) or matrix (the matrix optimizer)",
       .resume = {P::MUST_MATCH, "the routers' optimizer state is this optimizer's"},
       .check = Check::CHOICE,
       .choices = {"scalar", "matrix"}},
      {"router_lr", &Config::router_lr, "the routers' learning rate with router_opt scalar (0: lr)",
       P::LOGGED, Check::NON_NEGATIVE},
      // evaluation, checkpoints, logging
      {"val_loss_every", &Config::val_loss_every, "validation every N steps (0: only at the end)",
       P::FREE, Check::NON_NEGATIVE},
      {"val_tokens", &Config::val_tokens, "tokens per validation (a multiple of device_batch_size * sequence_length)",
       P::LOGGED, Check::POSITIVE},
      {"checkpoint_freq", &Config::checkpoint_freq, "checkpoint every N steps and at the end (0: never)",
       P::FREE, Check::NON_NEGATIVE},
      {"checkpoint_dir", &Config::checkpoint_dir, "folder for checkpoints; a run resumes from it (\"\": none)",
       P::FREE},
      {"wandb_project_name", &Config::wandb_project_name,
       "accepted for the reference's configs; no effect (metrics go to run_dir)", P::FREE},
      {"wandb_job_name", &Config::wandb_job_name, "accepted for the reference's configs; no effect", P::FREE},
      {"no_wandb", &Config::no_wandb, "accepted for the reference's configs; no effect", P::FREE},
      // optimizer
      {.name = "optimizer",
       .field = &Config::optimizer,
       .help = "matrix optimizer (a scalar one: every group runs it)",
       .resume = {P::MUST_MATCH, "the optimizer state is this optimizer's"},
       .check = Check::CHOICE,
       .catalog = Key::Catalog::ALL},
      {.name = "scalar_opt",
       .field = &Config::scalar_opt,
       .help = "optimizer of the embedding and lm_head",
       .resume = {P::MUST_MATCH, "the embedding's and lm_head's optimizer state is this optimizer's"},
       .check = Check::CHOICE,
       .catalog = Key::Catalog::SCALAR},
      {.name = "lr",
       .field = &Config::lr,
       .help = "base learning rate",
       .resume = P::LOGGED,
       .check = Check::OPTIMIZER,
       .hyperparameters = {"lr"}},
      {.name = "mu",
       .field = &Config::mu,
       .help = "momentum (or the error-feedback decay, where the optimizer has one)",
       .resume = P::LOGGED,
       .check = Check::OPTIMIZER,
       .hyperparameters = {"mu"}},
      {.name = "weight_decay",
       .field = &Config::weight_decay,
       .help = "weight decay of the matrix parameters",
       .resume = P::LOGGED,
       .check = Check::OPTIMIZER,
       .hyperparameters = {"weight_decay"}},
      {.name = "ortho_fraction",
       .field = &Config::ortho_fraction,
       .help = "selected fraction (selecting optimizers); rank fraction (low-rank ones)",
       .resume = {P::MUST_MATCH, "Dion's Q has rank_fraction x the width columns"},
       .check = Check::OPTIMIZER,
       .hyperparameters = {"fraction", "rank_fraction"}},
      {.name = "qr_method",
       .field = &Config::qr_method,
       .help = "Dion's orthonormalization (only rcqr is implemented)",
       .resume = {P::MUST_MATCH, "Dion's state follows its orthonormalization"},
       .check = Check::CHOICE,
       .choices = {"rcqr"},
       .reference_only = {{"qr", "rcqr"}, {"cqr", "rcqr"}}},
      {"cqr_warmup", &Config::cqr_warmup, "Dion cqr warmup (cqr is not implemented; no effect)", P::FREE, Check::RATIO},
      {.name = "rcqr_oversample",
       .field = &Config::rcqr_oversample,
       .help = "Dion randomized-QR sketch oversampling",
       .resume = P::LOGGED,
       .check = Check::OPTIMIZER,
       .hyperparameters = {"oversample"}},
      {"replicate_mesh_grad_sync", &Config::replicate_mesh_grad_sync,
       "data-parallel gradient sync inside the optimizer (optimizers that support it)",
       {P::MUST_MATCH, "legacy Dion keeps decoupled momenta under it"}},
      {"mixed_precision", &Config::mixed_precision, "Dion: bf16 momentum and Q",
       {P::MUST_MATCH, "the dtypes of Dion's momentum and Q"}},
      {.name = "adjust_lr",
       .field = &Config::adjust_lr,
       .help = "learning-rate scaling of the orthogonalized update",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"spectral_norm", "rms_norm", "none"}},
      {.name = "selection_scope",
       .field = &Config::selection_scope,
       .help = "the row-selecting optimizers under FSDP: the top-k rows per shard (local, the reference's) or over "
               "the whole matrix (global: equals one process)",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"local", "global"}},
      {"verbose", &Config::verbose, "accepted for the reference's configs; no effect", P::FREE},
      {"time_optimizer", &Config::time_optimizer, "print forward/backward and optimizer time separately", P::FREE},
      {"use_polar_express", &Config::use_polar_express,
       "orthogonalize with Polar Express (default: Newton-Schulz, as train.py)", P::LOGGED},
      {"use_gram_newton_schulz", &Config::use_gram_newton_schulz,
       "orthogonalize with Gram Newton-Schulz (the optimizers train.py passes it to; others ignore it)", P::FREE},
      {.name = "ortho_path",
       .field = &Config::ortho_path,
       .help = "orthogonalizer path of the orthogonalizing optimizers: fast (fewer, fused products; differs from exact "
               "by bf16 rounding, docs/train.md) or exact (the reference's operation order and bits)",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"exact", "fast"}},
      // distribution
      {"dp_size", &Config::dp_size,
       "data-parallel (replicated) size; dp_size x fs_size x tp_size = WORLD_SIZE (none of the three given: dp_size = "
       "WORLD_SIZE, DDP over every process, as train.py)",
       P::LAYOUT, Check::POSITIVE},
      {"fs_size", &Config::fs_size, "FSDP (sharded data-parallel) size", P::LAYOUT, Check::POSITIVE},
      {"tp_size", &Config::tp_size, "tensor-parallel size (divides n_head)", P::LAYOUT, Check::POSITIVE},
      {"ep_size", &Config::ep_size,
       "expert-parallel size: MoE experts split over ep ranks borrowed from dp_size x fs_size (divides both it and "
       "n_experts); when it divides fs_size, each ep rank's experts are split again over fs_size / ep_size ranks "
       "(EP x FSDP; n_experts then a multiple of fs_size)",
       P::LAYOUT, Check::POSITIVE},
      {"reshard_after_forward", &Config::reshard_after_forward,
       "FSDP: gather the blocks' weights again in backward instead of keeping them from forward (the reference's "
       "default)", P::FREE},
      {"fast_fsdp", &Config::fast_fsdp,
       "the reference's --fast_fsdp: reshard_after_forward false, and with gradient accumulation the gathered weights "
       "are kept across the step and their gradients reduce-scattered once per step (costs the whole model and its "
       "gradient per rank)", P::FREE},
      {"comm_timeout_s", &Config::comm_timeout_s,
       "seconds any collective may wait for the other ranks before the run fails", P::FREE, Check::POSITIVE},
      {"rendezvous_timeout_s", &Config::rendezvous_timeout_s,
       "seconds the start waits for all WORLD_SIZE ranks to arrive at MASTER_ADDR:MASTER_PORT before every rank there "
       "fails, saying how many came",
       P::FREE, Check::POSITIVE},
      {"ddp_bucket_mb", &Config::ddp_bucket_mb,
       "DDP gradient all-reduce bucket size, MB (launched as their gradients become ready)", P::FREE, Check::POSITIVE},
      {"replica_check_every", &Config::replica_check_every,
       "compare the data-parallel replicas' parameters bit for bit every N steps and before each checkpoint (0: never; "
       "one all_gather of 8 bytes a parameter)",
       P::FREE, Check::NON_NEGATIVE},
      // debugging
      {"debug", &Config::debug,
       "the reference's debug mode (batch 2, device batch 1, 20 steps, <= 2 val batches) on synthetic tokens",
       {P::MUST_MATCH, "debug mode trains on synthetic tokens with its own batch sizes"}},
      {"no_compile", &Config::no_compile,
       "accepted for the reference's configs; no effect (nothing is compiled at run time)", P::FREE},
      {"no_triton", &Config::no_triton, "accepted for the reference's configs; no effect (no Triton)", P::FREE},
      // ours
      {"run_dir", &Config::run_dir, "where metrics.jsonl and config.yaml go (\"\": runs/<config file stem>)", P::FREE},
      {.name = "device",
       .field = &Config::device,
       .help = "where to train: auto (cuda when a CUDA device is present, else cpu; the first line says which)",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"auto", "cpu", "cuda"}},
      {.name = "dtype",
       .field = &Config::dtype,
       .help = "compute dtype: auto (cuda: bf16 autocast from compute capability 8.0, else fp32; cpu: the faster, "
               "docs/train.md), fp32, bf16 (autocast)",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"auto", "fp32", "bf16"}},
      {.name = "model_kernels",
       .field = &Config::model_kernels,
       .help = "fast: oneDNN GEMMs on CPU and the lm_head + cross entropy fused (docs/train.md); exact: ATen in the "
               "reference's order",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"fast", "exact"}},
      {"seed", &Config::seed, "seed of the initialization and of debug mode's tokens",
       {P::MUST_MATCH,
        "debug mode's synthetic tokens are drawn from it (the generators are restored from the checkpoint)"},
       Check::NON_NEGATIVE},
      {"data_seed", &Config::data_seed,
       "the train data's order: 0 reads it from its first token; another value starts at a token offset drawn from "
       "it (a new cut of the stream into batches; validation unchanged)",
       {P::FREE, "it places only the first batch; a resumed run reads on from the checkpoint's position"},
       Check::NON_NEGATIVE},
      {"resume", &Config::resume, "resume from checkpoint_dir when it holds a checkpoint (false: start over)", P::FREE},
      {"resume_fallback", &Config::resume_fallback,
       "when checkpoint_dir's newest step_* folder is not a complete good checkpoint: resume from the newest good one, "
       "naming the bad ones (false: stop with an error)", P::FREE},
      {"stop_after", &Config::stop_after,
       "stop after this many steps of this invocation, checkpointing first (0: run to num_iterations)",
       P::FREE, Check::NON_NEGATIVE},
      {"log_every", &Config::log_every, "print a step line every N steps (metrics.jsonl gets every step)",
       P::FREE, Check::POSITIVE},
      {"cuda_graphs", &Config::cuda_graphs,
       "capture the training step (forward + backward of a micro-batch, the optimizer step) in CUDA graphs once and "
       "replay them (device cuda, one process)", P::FREE},
      {"cuda_kernels", &Config::cuda_kernels,
       "the optimizer's own CUDA kernels (fused element-wise steps, symmetric products by block rows + mirror), not "
       "yet checked on a GPU; false: ATen's CUDA ops (device cuda)", P::LOGGED},
      {"peak_tflops", &Config::peak_tflops,
       "the peak TFLOP/s the MFU of the step lines is measured against (0: a matmul in the run's dtype, timed once at "
       "the start)",
       P::FREE, Check::NON_NEGATIVE},
      // numerics keys (docs/train.md "Gradient norm, clipping, non-finite steps", "Parameter groups")
      {"grad_clip", &Config::grad_clip,
       "clip the global gradient norm to this before each optimizer step, as torch.nn.utils.clip_grad_norm_ (0: off; "
       "the norm is logged either way)",
       P::LOGGED, Check::NON_NEGATIVE},
      {"qk_clip_tau", &Config::qk_clip_tau,
       "QK-clip (MuonClip) after each optimizer step: every attention head whose largest logit in the step's "
       "forwards went above this has its c_q and c_k rows scaled so that it would be this (0: off; needs qk_norm "
       "false; docs/optimizers.md \"QK-clip\")",
       P::LOGGED, Check::NON_NEGATIVE},
      {"max_nonfinite_steps", &Config::max_nonfinite_steps,
       "a step whose loss or gradient is not finite is skipped (weights and optimizer state untouched); this many in a "
       "row are skipped, one more stops the run (0: the first stops it)",
       P::FREE, Check::NON_NEGATIVE},
      {.name = "scalar_beta1",
       .field = &Config::scalar_beta1,
       .help = "beta1 of the embedding and lm_head groups (scalar_opt); the default (0.9, 0.95) is what train.py runs "
               "(its betas=(0.95, 0.98) never reach its optimizers)",
       .resume = P::LOGGED,
       .check = Check::RATIO,
       .hyperparameters = {"betas"},
       .scalar = true},
      {.name = "scalar_beta2",
       .field = &Config::scalar_beta2,
       .help = "beta2 of the embedding and lm_head groups (scalar_opt)",
       .resume = P::LOGGED,
       .check = Check::RATIO,
       .hyperparameters = {"betas"},
       .scalar = true},
      {"embed_lr", &Config::embed_lr,
       "learning rate of the embedding group (0: the reference's rule, lr)", P::LOGGED, Check::NON_NEGATIVE},
      {"lm_head_lr", &Config::lm_head_lr,
       "learning rate of the lm_head group (0: the reference's rule, lr x lm_head_lr_scale: 1/sqrt(model_dim) for "
       "lion, else 1)",
       P::LOGGED, Check::NON_NEGATIVE},
      {.name = "fsdp_param_dtype",
       .field = &Config::fsdp_param_dtype,
       .help = "FSDP weight gathers: fp32, or bf16 as the reference's MixedPrecisionPolicy (param_dtype bf16: half the "
               "gather bytes, weights rounded to bf16 for compute; gradients reduce-scattered in fp32); no effect "
               "without fs_size > 1",
       .resume = P::LOGGED,
       .check = Check::CHOICE,
       .choices = {"fp32", "bf16"}},
  };
  return table;
}

// ---------------------------------------------------------------------------- lookups, text

const Key* find_key(const std::string& name) {
  for (const Key& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

namespace {
// Edit distance (insertions, deletions, substitutions) for "did you mean": a dozen lines, so
// not worth a library.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

// " (did you mean 'x'?)" for the nearest of `names` within a third of the word's length (at
// least 2 edits), or one that contains the word or is contained in it; "" when none is near.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  const size_t near = std::max<size_t>(2, word.size() / 3);  // the farthest a suggestion may be
  size_t best_d = near + 1;
  for (const std::string& n : names) {
    size_t d = edit_distance(word, n);
    const bool contains = n.find(word) != std::string::npos || word.find(n) != std::string::npos;
    if (d > near && word.size() >= 3 && contains) d = near;
    if (d < best_d) {
      best = n;
      best_d = d;
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::vector<std::string> all_key_names() {
  std::vector<std::string> out;
  for (const Key& k : keys()) out.push_back(k.name);
  return out;
}

std::string key_names() {
  std::string out;
  for (const Key& k : keys()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

const char* type_name(const Field& f) {
  switch (f.index()) {
    case 0:
      return "int";
    case 1:
      return "float";
    case 2:
      return "string";
    default:
      return "bool";
  }
}

std::string format_double(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

double number_of(const Config& c, const Field& f) {
  if (auto* m = std::get_if<int64_t Config::*>(&f)) return double(c.**m);
  if (auto* m = std::get_if<double Config::*>(&f)) return c.**m;
  return 0;
}

std::string value_text(const Config& c, const Field& f) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>)
          return format_double(v);
        else if constexpr (std::is_same_v<T, std::string>)
          return v;
        else
          return std::to_string(v);
      },
      f);
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::string out;
  for (const std::string& c : choices) out += (out.empty() ? "" : ", ") + c;
  return out;
}

const OptimizerChoice* find_optimizer(const std::string& name) {
  for (const OptimizerChoice& o : optimizer_catalog()) {
    if (o.name == name) return &o;
    for (const std::string& a : o.aliases)
      if (a == name) return &o;
  }
  return nullptr;
}

std::vector<std::string> choices_of(const Key& k) {
  if (k.catalog == Key::Catalog::NONE) return k.choices;
  std::vector<std::string> out;
  for (const OptimizerChoice& o : optimizer_catalog()) {
    if (k.catalog == Key::Catalog::SCALAR && o.matrix) continue;
    out.push_back(o.name);
    for (const std::string& a : o.aliases) out.push_back(a);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> reference_only_of(const Key& k) {
  if (k.catalog != Key::Catalog::ALL) return k.reference_only;
  std::vector<std::pair<std::string, std::string>> out;
  for (const OptimizerChoice& o : optimizer_catalog())
    for (const std::string& v : o.reference_variants) out.emplace_back(v, o.name);
  return out;
}

}  // namespace dion::train::config_detail
