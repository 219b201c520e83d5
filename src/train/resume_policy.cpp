// src/train/resume_policy.cpp — the check of what a resumed run may change (resume_policy.h), by
// the rule in each key's row of config_keys.cpp.
#include "dion/train/resume_policy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include "dion/data/shard_folder.h"
#include "dion/train/checkpoint.h"
#include "config_keys.h"

namespace dion::train {

namespace {

using P = ResumePolicy;

std::string config_items_value(double v) { return fmt::format("{}", v); }

uint32_t crc(uint32_t c, const void* p, size_t n) {
  return uint32_t(::crc32(c, static_cast<const Bytef*>(p), uInt(n)));
}

}  // namespace

std::optional<ResumePolicy> resume_policy(const std::string& key) {
  const config_detail::Key* k = config_detail::find_key(key);
  if (!k) return std::nullopt;
  return k->resume.policy;
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
    const config_detail::Key* row = config_detail::find_key(key);
    if (!row) throw std::logic_error("resume_policy.cpp: config_items gave '" + key + "', which is not a key");
    switch (row->resume.policy) {
      case P::MUST_MATCH:
        if (then != now)
          throw ConfigError(fmt::format(
              "key '{}': this run has '{}' but checkpoint '{}' was written with '{}'; a resumed run must keep it ({}). "
              "Run with --{} {} to continue that run, or start a new one (another checkpoint_dir, or --resume false)",
              key, now, ckpt.string(), then, row->resume.why, key, then.empty() ? "\"\"" : then));
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
