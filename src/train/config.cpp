// src/train/config.cpp — the table of dion-train's keys and everything that reads it: YAML and
// command-line parsing, per-key checks, the relations between keys, --help and the YAML dump.
//
// To add a key: a field in Config (config.h) with its default, and one row in kKeys below.
#include "dion/train/config.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <sstream>
#include <variant>

namespace dion::train {

namespace {

// ---------------------------------------------------------------------------- the table

using Field = std::variant<int64_t Config::*, double Config::*, std::string Config::*, bool Config::*>;

// What values a key accepts beyond its type.
enum class Check { ANY, POSITIVE, NON_NEGATIVE, RATIO, FRACTION, CHOICE };

struct Key {
  const char* name;
  Field field;
  const char* help;
  Check check = Check::ANY;
  std::vector<std::string> choices = {};
  // Values the reference's train.py accepts that are not implemented here -> the nearest choice.
  std::vector<std::pair<std::string, std::string>> reference_only = {};
};

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      // data
      {"data_dir", &Config::data_dir, "folder with fineweb_train_*.bin and fineweb_val_*.bin shards"},
      // training
      {"batch_size", &Config::batch_size, "global batch size, sequences (gradient accumulation = batch_size / device_batch_size)", Check::POSITIVE},
      {"device_batch_size", &Config::device_batch_size, "sequences per forward/backward pass", Check::POSITIVE},
      {"sequence_length", &Config::sequence_length, "tokens per sequence", Check::POSITIVE},
      {"num_iterations", &Config::num_iterations, "optimizer steps", Check::POSITIVE},
      {"warmup_ratio", &Config::warmup_ratio, "fraction of num_iterations with linear lr warmup", Check::RATIO},
      {"warmdown_ratio", &Config::warmdown_ratio, "fraction of num_iterations with linear lr decay to 0", Check::RATIO},
      // model
      {"model_dim", &Config::model_dim, "model width (divisible by n_head)", Check::POSITIVE},
      {"n_layer", &Config::n_layer, "transformer blocks", Check::POSITIVE},
      {"n_head", &Config::n_head, "attention heads", Check::POSITIVE},
      {"vocab_size", &Config::vocab_size, "embedding / lm_head rows: at least the data's vocabulary (GPT-2 shards 50257, byte shards 257); the reference pads 50257 to 50304", Check::POSITIVE},
      // evaluation, checkpoints, logging
      {"val_loss_every", &Config::val_loss_every, "validation every N steps (0: only at the end)", Check::NON_NEGATIVE},
      {"val_tokens", &Config::val_tokens, "tokens per validation (a multiple of device_batch_size * sequence_length)", Check::POSITIVE},
      {"checkpoint_freq", &Config::checkpoint_freq, "checkpoint every N steps and at the end (0: never)", Check::NON_NEGATIVE},
      {"checkpoint_dir", &Config::checkpoint_dir, "folder for checkpoints; a run resumes from it (\"\": none)"},
      {"wandb_project_name", &Config::wandb_project_name, "accepted for the reference's configs; no effect (metrics go to run_dir)"},
      {"wandb_job_name", &Config::wandb_job_name, "accepted for the reference's configs; no effect"},
      {"no_wandb", &Config::no_wandb, "accepted for the reference's configs; no effect"},
      // optimizer
      {"optimizer", &Config::optimizer, "matrix optimizer", Check::CHOICE,
       {"adamw", "lion", "muon", "normuon", "dion2", "nordion2", "dion3", "dion"},
       {{"dion_reference", "dion"}, {"dion_simple", "dion"}, {"muon_reference", "muon"}}},
      {"scalar_opt", &Config::scalar_opt, "optimizer of the embedding and lm_head", Check::CHOICE, {"adamw", "lion"}},
      {"lr", &Config::lr, "base learning rate", Check::NON_NEGATIVE},
      {"mu", &Config::mu, "momentum (Dion2: error-feedback decay)", Check::NON_NEGATIVE},
      {"weight_decay", &Config::weight_decay, "weight decay of the matrix parameters", Check::NON_NEGATIVE},
      {"ortho_fraction", &Config::ortho_fraction, "Dion2/NorDion2 selected fraction; Dion rank fraction", Check::FRACTION},
      {"qr_method", &Config::qr_method, "Dion's orthonormalization (only rcqr is implemented)", Check::CHOICE, {"rcqr"},
       {{"qr", "rcqr"}, {"cqr", "rcqr"}}},
      {"cqr_warmup", &Config::cqr_warmup, "Dion cqr warmup (cqr is not implemented; no effect)", Check::RATIO},
      {"rcqr_oversample", &Config::rcqr_oversample, "Dion randomized-QR sketch oversampling", Check::POSITIVE},
      {"replicate_mesh_grad_sync", &Config::replicate_mesh_grad_sync, "Dion: data-parallel gradient sync inside the optimizer (dion only)"},
      {"mixed_precision", &Config::mixed_precision, "Dion: bf16 momentum and Q"},
      {"adjust_lr", &Config::adjust_lr, "learning-rate scaling of the orthogonalized update", Check::CHOICE,
       {"spectral_norm", "rms_norm", "none"}},
      {"verbose", &Config::verbose, "accepted for the reference's configs; no effect"},
      {"time_optimizer", &Config::time_optimizer, "print forward/backward and optimizer time separately"},
      {"use_polar_express", &Config::use_polar_express, "orthogonalize with Polar Express (default: Newton-Schulz, as train.py)"},
      {"use_gram_newton_schulz", &Config::use_gram_newton_schulz, "Gram Newton-Schulz (not implemented: must be false)"},
      // distribution
      {"dp_size", &Config::dp_size, "data-parallel (replicated) size; dp_size x fs_size x tp_size = WORLD_SIZE", Check::POSITIVE},
      {"fs_size", &Config::fs_size, "FSDP (sharded data-parallel) size", Check::POSITIVE},
      {"tp_size", &Config::tp_size, "tensor-parallel size (divides n_head)", Check::POSITIVE},
      {"reshard_after_forward", &Config::reshard_after_forward, "FSDP: gather the blocks' weights again in backward instead of keeping them from forward (the reference's default)"},
      {"fast_fsdp", &Config::fast_fsdp, "the reference's --fast_fsdp: reshard_after_forward false, and with gradient accumulation the gathered weights are kept across the step and their gradients reduce-scattered once per step (costs the whole model and its gradient per rank)"},
      {"comm_timeout_s", &Config::comm_timeout_s, "seconds any collective may wait for the other ranks before the run fails", Check::POSITIVE},
      {"rendezvous_timeout_s", &Config::rendezvous_timeout_s, "seconds the start waits for all WORLD_SIZE ranks to arrive at MASTER_ADDR:MASTER_PORT before every rank there fails, saying how many came", Check::POSITIVE},
      {"ddp_bucket_mb", &Config::ddp_bucket_mb, "DDP gradient all-reduce bucket size, MB (launched as their gradients become ready)", Check::POSITIVE},
      {"replica_check_every", &Config::replica_check_every, "compare the data-parallel replicas' parameters bit for bit every N steps and before each checkpoint (0: never; one all_gather of 8 bytes a parameter)", Check::NON_NEGATIVE},
      // debugging
      {"debug", &Config::debug, "the reference's debug mode (batch 2, device batch 1, 20 steps, <= 2 val batches) on synthetic tokens"},
      {"no_compile", &Config::no_compile, "accepted for the reference's configs; no effect (nothing is compiled at run time)"},
      {"no_triton", &Config::no_triton, "accepted for the reference's configs; no effect (no Triton)"},
      // ours
      {"run_dir", &Config::run_dir, "where metrics.jsonl and config.yaml go (\"\": runs/<config file stem>)"},
      {"device", &Config::device, "where to train", Check::CHOICE, {"cpu", "cuda"}},
      {"dtype", &Config::dtype, "compute dtype: auto (cuda: bf16 autocast; cpu: the faster, docs/train.md), fp32, bf16 (autocast)",
       Check::CHOICE, {"auto", "fp32", "bf16"}},
      {"model_kernels", &Config::model_kernels,
       "fast: oneDNN GEMMs on CPU and the lm_head + cross entropy fused (docs/train.md); exact: ATen in the "
       "reference's order",
       Check::CHOICE, {"fast", "exact"}},
      {"seed", &Config::seed, "seed of the initialization and of debug mode's tokens", Check::NON_NEGATIVE},
      {"resume", &Config::resume, "resume from checkpoint_dir when it holds a checkpoint (false: start over)"},
      {"resume_fallback", &Config::resume_fallback, "when checkpoint_dir's newest step_* folder is not a complete good checkpoint: resume from the newest good one, naming the bad ones (false: stop with an error)"},
      {"stop_after", &Config::stop_after, "stop after this many steps of this invocation, checkpointing first (0: run to num_iterations)", Check::NON_NEGATIVE},
      {"log_every", &Config::log_every, "print a step line every N steps (metrics.jsonl gets every step)", Check::POSITIVE},
      {"cuda_graphs", &Config::cuda_graphs, "capture the training step (forward + backward of a micro-batch, the optimizer step) in CUDA graphs once and replay them (device cuda, one process)"},
      {"peak_tflops", &Config::peak_tflops, "the peak TFLOP/s the MFU of the step lines is measured against (0: a matmul in the run's dtype, timed once at the start)", Check::NON_NEGATIVE},
      // numerics keys (docs/train.md "Gradient norm, clipping, non-finite steps", "Parameter groups")
      {"grad_clip", &Config::grad_clip, "clip the global gradient norm to this before each optimizer step, as torch.nn.utils.clip_grad_norm_ (0: off; the norm is logged either way)", Check::NON_NEGATIVE},
      {"max_nonfinite_steps", &Config::max_nonfinite_steps, "a step whose loss or gradient is not finite is skipped (weights and optimizer state untouched); this many in a row are skipped, one more stops the run (0: the first stops it)", Check::NON_NEGATIVE},
      {"scalar_beta1", &Config::scalar_beta1, "beta1 of the embedding and lm_head groups (scalar_opt); the default (0.9, 0.95) is what train.py runs (its betas=(0.95, 0.98) never reach its optimizers)", Check::RATIO},
      {"scalar_beta2", &Config::scalar_beta2, "beta2 of the embedding and lm_head groups (scalar_opt)", Check::RATIO},
      {"fsdp_param_dtype", &Config::fsdp_param_dtype, "FSDP weight gathers: fp32, or bf16 as the reference's MixedPrecisionPolicy (param_dtype bf16: half the gather bytes, weights rounded to bf16 for compute; gradients reduce-scattered in fp32); no effect without fs_size > 1", Check::CHOICE, {"fp32", "bf16"}},
  };
  return table;
}

const Key* find_key(const std::string& name) {
  for (const Key& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

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

// " (did you mean 'x'?)" for the nearest of `names` within a third of the word's length (at
// least 2 edits), or one that contains the word or is contained in it; "" when none is near.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  const size_t near = std::max<size_t>(2, word.size() / 3);  // the farthest a suggestion may be
  size_t best_d = near + 1;
  for (const std::string& n : names) {
    size_t d = edit_distance(word, n);
    if (d > near && word.size() >= 3 && (n.find(word) != std::string::npos || word.find(n) != std::string::npos))
      d = near;
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
    case 0: return "int";
    case 1: return "float";
    case 2: return "string";
    default: return "bool";
  }
}

std::string format_double(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const Config& c, const Field& f) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) return format_double(v);
        else if constexpr (std::is_same_v<T, std::string>) return v;
        else return std::to_string(v);
      },
      f);
}

std::string join_choices(const std::vector<std::string>& choices) {
  std::string out;
  for (const std::string& c : choices) out += (out.empty() ? "" : ", ") + c;
  return out;
}

// ---------------------------------------------------------------------------- setting a key

// Sets `key` from a YAML node. `where`: "FILE" or "the command line", for messages.
void set_from_node(Config& c, const std::string& key, const YAML::Node& node, const std::string& where) {
  const Key* k = find_key(key);
  if (!k)
    throw ConfigError(fmt::format("{}: unknown key '{}'{}. Valid keys: {} (dion-train --help lists them with defaults)",
                                  where, key, did_you_mean(key, all_key_names()), key_names()));
  if (!node.IsDefined() || node.IsNull()) return;  // null: not set, the default applies
  const std::string text = node.IsScalar() ? node.Scalar() : std::string("<a YAML list or map>");
  auto bad = [&](const char* expected) {
    return ConfigError(fmt::format("{}: key '{}': value '{}' is not {}", where, key, text, expected));
  };
  if (!node.IsScalar()) throw bad("a single value");
  std::visit(
      [&](auto member) {
        auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        try {
          if constexpr (std::is_same_v<T, bool>) {
            v = node.as<bool>();
          } else if constexpr (std::is_same_v<T, int64_t>) {
            v = node.as<int64_t>();
          } else if constexpr (std::is_same_v<T, double>) {
            const double d = node.as<double>();
            if (!std::isfinite(d)) throw bad("a finite number");
            v = d;
          } else {
            v = node.as<std::string>();
          }
        } catch (const YAML::BadConversion&) {
          if constexpr (std::is_same_v<T, bool>) throw bad("a boolean (true or false)");
          else if constexpr (std::is_same_v<T, int64_t>) throw bad("an integer");
          else if constexpr (std::is_same_v<T, double>) throw bad("a number");
          else throw bad("a string");
        }
      },
      k->field);
}

// The per-key check: "" when valid, else what is valid.
std::string key_check(const Config& c, const Key& k) {
  auto num = [&]() -> double {
    if (auto* m = std::get_if<int64_t Config::*>(&k.field)) return double(c.**m);
    if (auto* m = std::get_if<double Config::*>(&k.field)) return c.**m;
    return 0;
  };
  switch (k.check) {
    case Check::ANY: return "";
    case Check::POSITIVE: return num() > 0 ? "" : "a value > 0";
    case Check::NON_NEGATIVE: return num() >= 0 ? "" : "a value >= 0";
    case Check::RATIO: return num() >= 0 && num() <= 1 ? "" : "a value in [0, 1]";
    case Check::FRACTION: return num() > 0 && num() <= 1 ? "" : "a value in (0, 1]";
    case Check::CHOICE: {
      const std::string v = value_text(c, k.field);
      for (const std::string& choice : k.choices)
        if (v == choice) return "";
      for (const auto& [ref, nearest] : k.reference_only)
        if (v == ref)
          return fmt::format("one of: {} ('{}' is the reference train.py's, not implemented here; the nearest is "
                             "'{}')", join_choices(k.choices), ref, nearest);
      return "one of: " + join_choices(k.choices) + did_you_mean(v, k.choices);
    }
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------- public

void config_set(Config& config, const std::string& key, const std::string& value) {
  const Key* k = find_key(key);
  if (k && std::holds_alternative<std::string Config::*>(k->field)) {  // text as given ("" included)
    config.*std::get<std::string Config::*>(k->field) = value;
    return;
  }
  if (k && std::holds_alternative<bool Config::*>(k->field) && value.empty()) {  // a bare --flag
    config.*std::get<bool Config::*>(k->field) = true;
    return;
  }
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception&) {
    node = YAML::Node(value);  // not YAML: a plain string
  }
  if (node.IsNull() && !value.empty() && value != "null" && value != "~") node = YAML::Node(value);
  set_from_node(config, key, node, "command line");
}

void config_load_yaml(Config& config, const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))  // (libstdc++ opens a folder, then fails to read it)
    throw ConfigError(fmt::format("config file '{}': is a folder; give a YAML file (e.g. configs/shakespeare_dion2.yaml)",
                                  file.string()));
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::BadFile&) {
    throw ConfigError(fmt::format("config file '{}': cannot be read (does it exist?)", file.string()));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("config file '{}': not valid YAML: {}", file.string(), e.what()));
  } catch (const std::exception& e) {  // a read error of the stream
    throw ConfigError(fmt::format("config file '{}': cannot be read: {}", file.string(), e.what()));
  }
  if (root.IsNull()) return;  // empty file
  if (!root.IsMap())
    throw ConfigError(fmt::format("config file '{}': expected a mapping of key: value lines", file.string()));
  std::map<std::string, int> seen;  // key -> its first line (yaml-cpp keeps both of a repeated key)
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar())  // `? [a]: 1`, `{a: 1}: 2` (found with tests/fuzz/fuzz_config.cpp)
      throw ConfigError(fmt::format("config file '{}': line {}: a key must be a plain name, not a YAML list or map",
                                    file.string(), line));
    const auto [first, fresh] = seen.emplace(kv.first.Scalar(), line);
    if (!fresh)
      throw ConfigError(fmt::format("config file '{}': line {}: key '{}' is given again (first on line {}); give "
                                    "each key once", file.string(), line, kv.first.Scalar(), first->second));
    set_from_node(config, kv.first.Scalar(), kv.second, file.string());
  }
}

int64_t Config::val_steps() const {
  const int64_t steps = val_tokens / (device_batch_size * sequence_length * data_parallel_size());
  return debug ? std::min<int64_t>(steps, 2) : steps;
}

std::filesystem::path Config::resolved_run_dir() const {
  if (!run_dir.empty()) return run_dir;
  const std::string stem = config_file.empty() ? "default" : std::filesystem::path(config_file).stem().string();
  return std::filesystem::path("runs") / stem;
}

void config_validate(const Config& c) {
  for (const Key& k : keys()) {
    const std::string valid = key_check(c, k);
    if (!valid.empty())
      throw ConfigError(fmt::format("key '{}': value '{}' is invalid; valid: {}", k.name, value_text(c, k.field), valid));
  }
  auto fail = [](const std::string& msg) { throw ConfigError(msg); };
  // The products below must fit in int64 (sequence_length 2^62 x device_batch_size 4 overflowed:
  // found with tests/fuzz/fuzz_config.cpp).
  int64_t product = 1;
  for (int64_t factor : {c.device_batch_size, c.sequence_length, c.dp_size, c.fs_size, c.tp_size})
    if (__builtin_mul_overflow(product, factor, &product))
      fail(fmt::format("device_batch_size {} x sequence_length {} x dp_size {} x fs_size {} x tp_size {} is larger "
                       "than 2^63: one of them is far too large",
                       c.device_batch_size, c.sequence_length, c.dp_size, c.fs_size, c.tp_size));
  if (c.n_head % c.tp_size != 0)
    fail(fmt::format("key 'tp_size': value {} does not divide n_head {} (tensor parallelism splits the heads); "
                     "valid: a divisor of n_head", c.tp_size, c.n_head));
  if (c.model_dim % c.n_head != 0)
    fail(fmt::format("key 'model_dim': value {} is not divisible by n_head {}; valid: a multiple of n_head",
                     c.model_dim, c.n_head));
  if ((c.model_dim / c.n_head) % 2 != 0)
    fail(fmt::format("model_dim {} / n_head {} = head size {} is odd; rotary embeddings need an even head size",
                     c.model_dim, c.n_head, c.model_dim / c.n_head));
  if (c.warmup_ratio + c.warmdown_ratio > 1 + 1e-12)  // (0.3 + 0.7 may round above 1)
    fail(fmt::format("keys 'warmup_ratio' {} + 'warmdown_ratio' {} = {} > 1: the warmup and the warmdown would "
                     "overlap; valid: a sum <= 1", format_double(c.warmup_ratio), format_double(c.warmdown_ratio),
                     format_double(c.warmup_ratio + c.warmdown_ratio)));
  const int64_t dp = c.dp_size * c.fs_size;
  if (c.batch_size % (c.device_batch_size * dp) != 0)
    fail(fmt::format("key 'batch_size': value {} is not divisible by device_batch_size {} x data-parallel ranks {}; "
                     "valid: a multiple of {}",
                     c.batch_size, c.device_batch_size, dp, c.device_batch_size * dp));
  const int64_t val_batch = c.device_batch_size * c.sequence_length * dp;
  if (c.val_tokens % val_batch != 0)
    fail(fmt::format("key 'val_tokens': value {} is not a multiple of device_batch_size x sequence_length x "
                     "data-parallel ranks = {}; valid: e.g. {}",
                     c.val_tokens, val_batch, std::max<int64_t>(1, c.val_tokens / val_batch) * val_batch));
  if (c.checkpoint_freq > 0 && c.checkpoint_dir.empty())
    fail(fmt::format("key 'checkpoint_freq': value {} needs checkpoint_dir (it is empty)", c.checkpoint_freq));
  if (c.stop_after > 0 && c.checkpoint_dir.empty())
    fail(fmt::format("key 'stop_after': value {} needs checkpoint_dir to continue from (it is empty)", c.stop_after));
  if (c.replicate_mesh_grad_sync && c.optimizer != "dion")
    fail(fmt::format("key 'replicate_mesh_grad_sync': true is for optimizer dion only (optimizer is '{}')", c.optimizer));
  // numerics keys
  if (c.grad_clip > 0 && c.replicate_mesh_grad_sync && c.dp_size > 1)
    fail(fmt::format("key 'grad_clip': value {} needs the gradient summed over the dp replicas, which legacy Dion "
                     "with replicate_mesh_grad_sync never forms (dp_size {}); valid: grad_clip 0, or "
                     "replicate_mesh_grad_sync false", format_double(c.grad_clip), c.dp_size));
  if (c.scalar_opt == "adamw" && c.optimizer != "adamw" && c.optimizer != "lion" &&
      (c.scalar_beta1 >= 1 || c.scalar_beta2 >= 1))
    fail(fmt::format("keys 'scalar_beta1' {} / 'scalar_beta2' {}: AdamW (scalar_opt adamw) needs each beta < 1 (its "
                     "bias correction divides by 1 - beta^t); valid: betas in [0, 1)",
                     format_double(c.scalar_beta1), format_double(c.scalar_beta2)));
  if (c.use_gram_newton_schulz)
    fail("key 'use_gram_newton_schulz': true is not implemented; valid: false");
  if (c.cuda_graphs && c.device != "cuda")
    fail(fmt::format("key 'cuda_graphs': true needs device cuda (a CUDA graph captures GPU work; device is '{}'); "
                     "valid: false, or device cuda", c.device));
  if (c.cuda_graphs && c.dp_size * c.fs_size * c.tp_size > 1)
    fail(fmt::format("key 'cuda_graphs': true is supported for one process only (dp_size {} x fs_size {} x tp_size {} "
                     "= {} processes): the DDP bucket all-reduces, FSDP gathers and TP all-reduces of the step are "
                     "issued from the host as the backward runs and cannot be captured; valid: false, or dp_size = "
                     "fs_size = tp_size = 1", c.dp_size, c.fs_size, c.tp_size, c.dp_size * c.fs_size * c.tp_size));
}

Config config_parse(int argc, const char* const* argv) {
  // Every key is a "--key" option with 0 or 1 values (0 only makes sense for booleans).
  CLI::App app{"dion-train", "dion-train"};
  app.set_help_flag();  // our own --help (config_help)
  app.allow_extras();
  std::string config_file;
  bool help = false;
  std::vector<std::string> config_files;
  app.add_option("--config", config_files)->expected(1)->allow_extra_args(false)->multi_option_policy(
      CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("-h,--help", help);
  std::map<std::string, std::vector<std::string>> given;
  for (const Key& k : keys()) {
    auto* opt = app.add_option(std::string("--") + k.name, given[k.name]);
    opt->expected(std::holds_alternative<bool Config::*>(k.field) ? 0 : 1, 1);
    // One value per key: `--lr 0.01 0.7` leaves 0.7 as a stray word (an error below) instead of
    // CLI11 collecting both into the vector; a key given twice is an error below too.
    opt->allow_extra_args(false);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw ConfigError(fmt::format("command line: {}", e.what()));
  }
  if (help) throw HelpRequested(config_help());
  for (const std::string& extra : app.remaining()) {
    std::string key = extra;
    if (key.rfind("--", 0) == 0) {
      key = key.substr(2, key.find('=') == std::string::npos ? std::string::npos : key.find('=') - 2);
      throw ConfigError(fmt::format("command line: unknown key '{}'{}. Valid keys: {} (dion-train --help lists "
                                    "them with defaults)", key, did_you_mean(key, all_key_names()), key_names()));
    }
    throw ConfigError(fmt::format("command line: unexpected argument '{}' (keys are given as --key value)", extra));
  }

  if (config_files.size() > 1)
    throw ConfigError(fmt::format("command line: --config given more than once ('{}', '{}'); give one YAML file "
                                  "(keys on the command line override it)", config_files[0], config_files[1]));
  config_file = config_files.empty() ? std::string() : config_files[0];
  for (const Key& k : keys()) {
    const size_t times = app.count(std::string("--") + k.name);
    if (times > 1) {
      std::string values;
      for (const std::string& v : given[k.name]) values += (values.empty() ? "'" : ", '") + v + "'";
      throw ConfigError(fmt::format("command line: key '{}' given {} times{}; give it once (a value on the command "
                                    "line overrides the --config file's)",
                                    k.name, times, values.empty() ? "" : " (values " + values + ")"));
    }
  }

  Config c;
  c.config_file = config_file;
  if (!config_file.empty()) config_load_yaml(c, config_file);
  for (const Key& k : keys()) {
    const auto& values = given[k.name];
    if (app.count(std::string("--") + k.name) == 0) continue;
    config_set(c, k.name, values.empty() ? std::string() : values.back());
  }
  if (c.debug) {  // the reference's debug mode (train.py main())
    c.batch_size = 2 * c.dp_size * c.fs_size;
    c.device_batch_size = 1;
    c.num_iterations = 20;
  }
  config_validate(c);
  return c;
}

std::vector<std::pair<std::string, std::string>> config_items(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Key& k : keys()) out.emplace_back(k.name, value_text(c, k.field));
  return out;
}

std::string config_to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const Key& k : keys()) {
    out << YAML::Key << k.name << YAML::Value;
    std::visit(
        [&](auto member) {
          const auto& v = c.*member;
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, double>) out << format_double(v);  // exact, shortest
          else if constexpr (std::is_same_v<T, std::string>) out << YAML::DoubleQuoted << v;
          else out << v;
        },
        k.field);
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_help() {
  const Config defaults;
  std::ostringstream os;
  os << "dion-train: train the reference's GPT with a dion optimizer (docs/train.md)\n\n"
        "usage:\n"
        "  dion-train [--config FILE.yaml] [--key value ...]   train (command-line values override the file)\n"
        "  dion-train --nproc N [--config FILE.yaml] [...]     train in N local processes (as torchrun\n"
        "                                                      --nproc_per_node N; docs/train.md \"Launching\")\n"
        "  dion-train plot RUN_DIR... -o curves.png             loss curves of runs in one PNG\n"
        "  dion-train sample --checkpoint DIR --prompt TEXT     generate text from a checkpoint\n\n"
        "keys (YAML file or --key value; booleans also as a bare --key):\n";
  for (const Key& k : keys()) {
    std::string line = fmt::format("  --{:<26} {:<6} default {}", k.name, type_name(k.field),
                                   value_text(defaults, k.field).empty() ? "\"\"" : value_text(defaults, k.field));
    os << line << "\n      " << k.help;
    if (k.check == Check::CHOICE) os << " {" << join_choices(k.choices) << "}";
    os << "\n";
  }
  return os.str();
}

}  // namespace dion::train
