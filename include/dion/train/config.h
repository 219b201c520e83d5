// dion/train/config.h — dion-train's configuration: one table of keys, read from a YAML file and
// overridden by command-line flags.
//
// The keys are the reference train.py's flags (its Hyperparameters dataclass plus its argparse
// flags), with the same names, types and defaults, plus a few of ours (run_dir, device, dtype,
// seed, resume, stop_after). Every key is declared ONCE, in the table in config_keys.cpp (name, the
// Config field it sets, a help line, an optional check); parsing, --help, validation and the
// config.yaml dump of a run all read that table.
//
//   Config c = config_parse(argc, argv);      // --config FILE.yaml, then --key value overrides
//
// Rules (docs/train.md "Keys"):
//   - YAML `null` (or `~`) means "not set": the default applies (the reference's configs write
//     `dp_size: null`).
//   - A command-line value is read as a YAML scalar, so `--lr 1e-3` and `lr: 1e-3` are the same;
//     a boolean key given as a bare flag (`--debug`) means true.
//   - An unknown key, a value of the wrong type or an impossible value throws ConfigError naming
//     the key, the value and what is valid. The program prints it and exits with code 2 before
//     writing anything.
//
// What it does not do: read data, build the model or the optimizer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace dion::train {

// A bad configuration: unknown key, wrong type, impossible value. Exit code 2.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& message) : std::runtime_error(message) {}
};

// Every key, with the reference's defaults (train.py Hyperparameters / argparse).
struct Config {
  // ---- data
  std::string data_dir = "data/fineweb10B";
  // ---- training
  int64_t batch_size = 8 * 64;     // global batch, sequences
  int64_t device_batch_size = 64;  // sequences per forward/backward
  int64_t sequence_length = 1024;
  int64_t num_iterations = 5000;
  double warmup_ratio = 0.01;
  double warmdown_ratio = 0.2;
  // ---- model
  int64_t model_dim = 768;
  int64_t n_layer = 12;
  int64_t n_head = 6;
  int64_t vocab_size = 50304;  // rows of the embedding / lm_head; >= the data's vocabulary (GPT-2 50257, bytes 257)
  bool qk_norm = true;         // q and k RMS-normed per head (the reference); false: as projected
  // ---- mixture of experts (dion/train/moe.h; n_experts 0: the dense MLP everywhere)
  int64_t n_experts = 0;
  int64_t top_k = 2;
  int64_t expert_dim = 0;  // 0: 4 x model_dim / (top_k + n_shared_experts), the dense MLP's active size
  int64_t n_shared_experts = 0;
  int64_t moe_every = 1;
  std::string router_score = "softmax";  // softmax | sigmoid
  double moe_bias_rate = 1e-3;           // auxiliary-loss-free balancing: expert bias step per optimizer step
  double moe_aux_loss_coef = 0;          // sequence-wise balance loss coefficient (0: off)
  std::string router_opt = "scalar";     // scalar (scalar_opt, as the embedding) | matrix (the matrix optimizer)
  double router_lr = 0;                  // the routers' lr with router_opt scalar (0: lr)
  int64_t ep_size = 1;                   // expert-parallel ranks, borrowed from dp x fs
  // ---- evaluation, checkpoints, logging
  int64_t val_loss_every = 125;
  int64_t val_tokens = 10485760;
  int64_t checkpoint_freq = 0;
  std::string checkpoint_dir = "";
  std::string wandb_project_name = "dion-test";
  std::string wandb_job_name = "";
  bool no_wandb = false;
  // ---- optimizer
  std::string optimizer = "dion";
  std::string scalar_opt = "lion";
  double lr = 0.02;
  double mu = 0.95;
  double weight_decay = 0.01;
  double ortho_fraction = 0.25;
  std::string qr_method = "rcqr";
  double cqr_warmup = 0.05;
  double rcqr_oversample = 1.25;
  bool replicate_mesh_grad_sync = false;
  bool mixed_precision = false;
  std::string adjust_lr = "spectral_norm";
  std::string selection_scope = "local";
  bool verbose = true;
  bool time_optimizer = false;
  bool use_polar_express = false;
  bool use_gram_newton_schulz = false;
  // math::OrthoConfig::path of every matrix optimizer: fast (docs/train.md); the library's and the
  // Python module's default stays exact.
  std::string ortho_path = "fast";
  // ---- distribution (dion/train/parallel.h): dp_size * fs_size * tp_size = WORLD_SIZE
  int64_t dp_size = 1;
  int64_t fs_size = 1;
  int64_t tp_size = 1;
  bool reshard_after_forward = true;  // effective unless fast_fsdp (as train.py: not --fast_fsdp)
  bool fast_fsdp = false;
  double comm_timeout_s = 300;        // every collective of the run waits at most this long
  double rendezvous_timeout_s = 120;  // the start waits at most this long for every rank to arrive
  double ddp_bucket_mb = 25;          // DDP gradient all-reduce bucket size
  int64_t replica_check_every = 100;  // dp replicas compared bit for bit every N steps (0: never)
  // ---- debugging / reference flags without an effect here
  bool debug = false;
  bool no_compile = false;
  bool no_triton = false;
  // ---- ours
  std::string run_dir = "";            // "" -> runs/<config file stem> (runs/default without --config)
  std::string device = "auto";         // auto (cuda when a CUDA device is present, else cpu) | cpu | cuda
  std::string dtype = "auto";          // auto | fp32 | bf16 (autocast)
  std::string model_kernels = "fast";  // fast | exact (dion/train/kernels.h)
  int64_t seed = 1337;
  int64_t data_seed = 0;  // 0: the train data from its first token; else a seeded start (loader.h)
  bool resume = true;
  bool resume_fallback = false;  // resume from the newest GOOD checkpoint when the newest is bad
  int64_t stop_after = 0;
  int64_t log_every = 1;
  bool cuda_graphs = false;   // capture the training step in CUDA graphs (train/graphed_step.h)
  bool cuda_kernels = false;  // the project's own CUDA kernels in the optimizer (math/own_kernels.h)
  double peak_tflops = 0;     // the MFU's peak; 0: a matmul measured once at the start
  // ---- numerics keys (docs/train.md "Gradient norm, clipping, non-finite steps")
  double grad_clip = 0;                   // clip the global gradient norm to this (0: off)
  double qk_clip_tau = 0;                 // QK-clip after each step at this logit (0: off; needs qk_norm false)
  int64_t max_nonfinite_steps = 3;        // non-finite steps in a row skipped; one more stops the run
  double scalar_beta1 = 0.9;              // the embedding / lm_head groups' betas: train.py's effective
  double scalar_beta2 = 0.95;             //   (0.9, 0.95) (docs/train.md "Parameter groups")
  double embed_lr = 0;                    // the embedding group's lr (0: lr, the reference's rule)
  double lm_head_lr = 0;                  // the lm_head group's lr (0: lr x lm_head_lr_scale)
  std::string fsdp_param_dtype = "fp32";  // FSDP weight gathers: fp32 | bf16 (the reference's policy)

  std::string config_file;  // the --config path ("" without one); not a key
  // Not keys either: the keys the YAML file or the command line set (null values do not count),
  // in the order set; and whether dp_size was taken from WORLD_SIZE because none of dp_size,
  // fs_size, tp_size was set (train.py's DDP over every process).
  std::vector<std::string> keys_set;
  bool mesh_from_world = false;

  // Derived values (after validation).
  // Data-parallel ranks: every (dp, fs) mesh position reads its own slice of the batch.
  int64_t data_parallel_size() const { return dp_size * fs_size; }
  // expert_dim, resolved (moe.h).
  int64_t resolved_expert_dim() const {
    return expert_dim > 0 ? expert_dim : std::max<int64_t>(1, 4 * model_dim / (top_k + n_shared_experts));
  }
  // Per rank: batch_size / (device_batch_size x data-parallel ranks).
  int64_t grad_accum_steps() const { return batch_size / (device_batch_size * data_parallel_size()); }
  // Per rank: val_tokens / (device_batch_size x sequence_length x data-parallel ranks), debug: <= 2.
  int64_t val_steps() const;
  std::filesystem::path resolved_run_dir() const;
};

// Parses argv: `--config FILE` (optional), then `--key value` / `--key=value` / `--flag`.
// With none of dp_size, fs_size, tp_size set, dp_size = the world size (as train.py: DDP over
// every process): `world_size`, or when it is 0 the WORLD_SIZE variable (unset: 1). Applies
// debug mode's overrides (as the reference: batch 2, device batch 1, 20 iterations) and
// validates. Throws ConfigError. `--help` throws HelpRequested with the text to print.
Config config_parse(int argc, const char* const* argv, int64_t world_size = 0);

// Reads a YAML file into `config` (keys it sets only). Throws ConfigError naming the file.
void config_load_yaml(Config& config, const std::filesystem::path& file);
// Sets one key from command-line text: strings as given, "" for a boolean = true, anything
// else read as a YAML scalar. Throws ConfigError.
void config_set(Config& config, const std::string& key, const std::string& value);
// Checks every key and the relations between keys. Throws ConfigError.
void config_validate(const Config& config);
// Every key and its value as text (table order): what the ranks of a run compare.
std::vector<std::pair<std::string, std::string>> config_items(const Config& config);
// The resolved configuration as YAML (every key, table order).
std::string config_to_yaml(const Config& config);
// --help: every key, its type, default and help line.
std::string config_help();

// Thrown by config_parse for --help / -h; what() is the help text.
class HelpRequested : public std::runtime_error {
 public:
  explicit HelpRequested(const std::string& text) : std::runtime_error(text) {}
};

}  // namespace dion::train
