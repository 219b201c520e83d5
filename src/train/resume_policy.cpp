// src/train/resume_policy.cpp — the table of what a resumed run may change, and the check
// (resume_policy.h).
#include "dion/train/resume_policy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <map>

#include "dion/data/shard_folder.h"
#include "config_keys.h"

namespace dion::train {

namespace {

using P = ResumePolicy;

struct Row {
  P policy;
  const char* why;  // MUST_MATCH: what the saved state depends on
};

// One row per key of config_keys.cpp's table.
const std::map<std::string, Row>& table() {
  static const std::map<std::string, Row> rows = {
      {"data_dir", {P::FREE, "the data's identity is checked by its fingerprint, not its path"}},
      {"batch_size", {P::MUST_MATCH, "the loader position and the token count are in global batches"}},
      {"device_batch_size", {P::LOGGED, ""}},
      {"sequence_length", {P::MUST_MATCH, "the model's positions and the loader position depend on it"}},
      {"num_iterations", {P::LOGGED, ""}},
      {"warmup_ratio", {P::LOGGED, ""}},
      {"warmdown_ratio", {P::LOGGED, ""}},
      {"model_dim", {P::MUST_MATCH, "the saved tensors have its shape"}},
      {"n_layer", {P::MUST_MATCH, "the saved tensors are its layers"}},
      {"n_head", {P::MUST_MATCH, "the attention and the optimizer's per-head state depend on it"}},
      {"qk_norm", {P::MUST_MATCH, "the attention computes another function without it"}},
      {"val_loss_every", {P::FREE, ""}},
      {"val_tokens", {P::LOGGED, ""}},
      {"checkpoint_freq", {P::FREE, ""}},
      {"checkpoint_dir", {P::FREE, ""}},
      {"wandb_project_name", {P::FREE, ""}},
      {"wandb_job_name", {P::FREE, ""}},
      {"no_wandb", {P::FREE, ""}},
      {"optimizer", {P::MUST_MATCH, "the optimizer state is this optimizer's"}},
      {"scalar_opt", {P::MUST_MATCH, "the embedding's and lm_head's optimizer state is this optimizer's"}},
      {"lr", {P::LOGGED, ""}},
      {"mu", {P::LOGGED, ""}},
      {"weight_decay", {P::LOGGED, ""}},
      {"ortho_fraction", {P::MUST_MATCH, "Dion's Q has rank_fraction x the width columns"}},
      {"qr_method", {P::MUST_MATCH, "Dion's state follows its orthonormalization"}},
      {"cqr_warmup", {P::FREE, ""}},
      {"rcqr_oversample", {P::LOGGED, ""}},
      {"replicate_mesh_grad_sync", {P::MUST_MATCH, "legacy Dion keeps decoupled momenta under it"}},
      {"mixed_precision", {P::MUST_MATCH, "the dtypes of Dion's momentum and Q"}},
      {"adjust_lr", {P::LOGGED, ""}},
      {"selection_scope", {P::LOGGED, ""}},
      {"verbose", {P::FREE, ""}},
      {"time_optimizer", {P::FREE, ""}},
      {"use_polar_express", {P::LOGGED, ""}},
      {"use_gram_newton_schulz", {P::FREE, ""}},
      {"ortho_path", {P::LOGGED, ""}},
      {"dp_size", {P::LAYOUT, ""}},
      {"fs_size", {P::LAYOUT, ""}},
      {"tp_size", {P::LAYOUT, ""}},
      {"reshard_after_forward", {P::FREE, ""}},
      {"fast_fsdp", {P::FREE, ""}},
      {"comm_timeout_s", {P::FREE, ""}},
      {"rendezvous_timeout_s", {P::FREE, ""}},
      {"vocab_size", {P::MUST_MATCH, "the embedding and lm_head have vocab_size rows"}},
      {"n_experts", {P::MUST_MATCH, "the saved expert stacks have n_experts experts"}},
      {"top_k", {P::LOGGED, ""}},
      {"expert_dim", {P::MUST_MATCH, "the saved expert stacks have its shape"}},
      {"n_shared_experts", {P::MUST_MATCH, "the saved shared experts have its shape"}},
      {"moe_every", {P::MUST_MATCH, "the saved layers are MoE or dense by it"}},
      {"router_score", {P::LOGGED, ""}},
      {"moe_bias_rate", {P::LOGGED, ""}},
      {"moe_aux_loss_coef", {P::LOGGED, ""}},
      {"router_opt", {P::MUST_MATCH, "the routers' optimizer state is this optimizer's"}},
      {"router_lr", {P::LOGGED, ""}},
      {"ep_size", {P::LAYOUT, ""}},
      {"replica_check_every", {P::FREE, ""}},
      {"ddp_bucket_mb", {P::FREE, ""}},
      {"debug", {P::MUST_MATCH, "debug mode trains on synthetic tokens with its own batch sizes"}},
      {"no_compile", {P::FREE, ""}},
      {"no_triton", {P::FREE, ""}},
      {"run_dir", {P::FREE, ""}},
      {"device", {P::LOGGED, ""}},
      {"dtype", {P::LOGGED, ""}},
      {"model_kernels", {P::LOGGED, ""}},
      {"seed",
       {P::MUST_MATCH,
        "debug mode's synthetic tokens are drawn from it (the generators are restored from the checkpoint)"}},
      {"data_seed", {P::FREE, "it places only the first batch; a resumed run reads on from the checkpoint's position"}},
      {"resume", {P::FREE, ""}},
      {"resume_fallback", {P::FREE, ""}},
      {"stop_after", {P::FREE, ""}},
      {"log_every", {P::FREE, ""}},
      {"cuda_graphs", {P::FREE, ""}},
      {"cuda_kernels", {P::LOGGED, ""}},
      {"peak_tflops", {P::FREE, ""}},
      // numerics keys
      {"grad_clip", {P::LOGGED, ""}},
      {"qk_clip_tau", {P::LOGGED, ""}},
      {"max_nonfinite_steps", {P::FREE, ""}},
      {"scalar_beta1", {P::LOGGED, ""}},
      {"scalar_beta2", {P::LOGGED, ""}},
      {"embed_lr", {P::LOGGED, ""}},
      {"lm_head_lr", {P::LOGGED, ""}},
      {"fsdp_param_dtype", {P::LOGGED, ""}},
  };
  return rows;
}

std::string config_items_value(double v) { return fmt::format("{}", v); }

uint32_t crc(uint32_t c, const void* p, size_t n) {
  return uint32_t(::crc32(c, static_cast<const Bytef*>(p), uInt(n)));
}

}  // namespace

std::optional<ResumePolicy> resume_policy(const std::string& key) {
  auto it = table().find(key);
  if (it == table().end()) return std::nullopt;
  return it->second.policy;
}

std::string data_fingerprint(const Config& c) {
  if (c.debug) return fmt::format("synthetic tokens, seed {}", c.seed);
  const data::ShardFolder folder = data::shard_folder_read(c.data_dir, "fineweb");
  uint32_t h = crc(0, nullptr, 0);
  std::string head(64 * 1024, '\0');
  for (const data::ShardFolderEntry& e : folder.train) {
    const std::string name = e.path.filename().string();
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(e.path, ec);
    h = crc(h, name.data(), name.size());
    h = crc(h, &size, sizeof size);
    const int fd = ::open(e.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      const ssize_t n = ::pread(fd, head.data(), head.size(), 0);
      if (n > 0) h = crc(h, head.data(), size_t(n));
      ::close(fd);
    }
  }
  return fmt::format("{} train shards, crc32 {:08x}", folder.train.size(), h);
}

std::vector<std::string> resume_check(const Config& c, const CheckpointMeta& meta, const std::filesystem::path& ckpt,
                                      const std::string& fingerprint) {
  std::vector<std::string> lines;
  YAML::Node saved;
  try {
    saved = YAML::Load(meta.config_yaml);
  } catch (const YAML::Exception& e) {
    throw CheckpointError(
        fmt::format("'{}': key 'config_yaml' is not valid YAML: {}", (ckpt / "meta.json").string(), e.what()));
  }
  const std::string name = ckpt.filename().string();
  std::vector<std::string> changed;
  std::string layout_from, layout_to;
  for (const auto& [key, now] : config_items(c)) {
    const YAML::Node node = saved[key];
    if (!node.IsDefined() || !node.IsScalar()) continue;  // a key the checkpoint's program did not have
    const std::string then = node.Scalar();
    auto row = table().find(key);
    if (row == table().end())
      throw std::logic_error("resume_policy.cpp: key '" + key + "' has no row in the resume table");
    switch (row->second.policy) {
      case P::MUST_MATCH:
        if (then != now)
          throw ConfigError(fmt::format(
              "key '{}': this run has '{}' but checkpoint '{}' was written with '{}'; a resumed run must keep it ({}). "
              "Run with --{} {} to continue that run, or start a new one (another checkpoint_dir, or --resume false)",
              key, now, ckpt.string(), then, row->second.why, key, then.empty() ? "\"\"" : then));
        break;
      case P::LOGGED:
        if (then != now) changed.push_back(fmt::format("{} {} -> {}", key, then, now));
        break;
      case P::LAYOUT:
        break;
      case P::FREE:
        break;
    }
  }
  // numerics keys: a checkpoint from before scalar_beta1/2 ran its embedding and lm_head with
  // (0.95, 0.98) (the default then); say so rather than change them silently.
  if (!saved["scalar_beta1"].IsDefined() && config_detail::find_optimizer(c.optimizer) &&
      config_detail::find_optimizer(c.optimizer)->matrix)
    lines.push_back(
        fmt::format("  resuming {} with scalar betas ({}, {}); it was trained by a dion-train without the "
                    "scalar_beta keys, which used (0.95, 0.98): pass --scalar_beta1 0.95 --scalar_beta2 "
                    "0.98 to keep those",
                    name, config_items_value(c.scalar_beta1), config_items_value(c.scalar_beta2)));
  if (!meta.data_fingerprint.empty() && meta.data_fingerprint != fingerprint)
    throw ConfigError(fmt::format(
        "the training data differs from the checkpoint's: '{}' holds {}, checkpoint '{}' was trained on {}; the "
        "saved loader position means nothing on other data. Point data_dir at the checkpoint's data set, or start a "
        "new run (another checkpoint_dir, or --resume false)",
        c.data_dir, fingerprint, ckpt.string(), meta.data_fingerprint));
  if (meta.dp_size != c.dp_size || meta.fs_size != c.fs_size || meta.tp_size != c.tp_size)
    lines.push_back(
        fmt::format("  resuming at another layout: dp {} x fs {} x tp {} -> dp {} x fs {} x tp {} (resharded)",
                    meta.dp_size, meta.fs_size, meta.tp_size, c.dp_size, c.fs_size, c.tp_size));
  if (!changed.empty()) {
    std::string text;
    for (const std::string& s : changed) text += (text.empty() ? "" : ", ") + s;
    lines.push_back(fmt::format("  resuming {} with changed keys: {}", name, text));
  }
  return lines;
}

}  // namespace dion::train
