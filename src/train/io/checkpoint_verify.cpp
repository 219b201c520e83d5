// src/train/io/checkpoint_verify.cpp — the whole check of a checkpoint before anything loads
// (manifest, sizes, CRC-32s, the file set, meta.json's values), and choosing one (checkpoint.h).
#include "dion/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stdio.h>
#include <sys/stat.h>
#include <torch/serialize/archive.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <vector>

#include "dion/comm/group.h"
#include "dion/train/checkpoint_files.h"
#include "dion/train/fs_util.h"
#include "dion/train/parallel.h"
#include "checkpoint_detail.h"

namespace dion::train {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace detail;

namespace {

// meta.json's values, each checked: "" or what is wrong, naming the key.
std::string meta_problem(const json& meta, const fs::path& file, CheckpointMeta* out) {
  const std::string f = file.string();
  auto bad = [&](const std::string& key, const std::string& value, const std::string& valid) {
    return fmt::format("'{}': key '{}': value {} is invalid; valid: {} (the file was edited or damaged)", f, key, value,
                       valid);
  };
  try {
    if (meta.at("format") != "dion-train checkpoint")
      return fmt::format("'{}': format {} is not 'dion-train checkpoint'", f, meta.at("format").dump());
    const int version = meta.at("version").get<int>();
    if (version != kCheckpointVersion && version != 1)
      return fmt::format("'{}': version {}; this program reads versions 1 and {}", f, version, kCheckpointVersion);
    CheckpointMeta m;
    m.version = version;
    TrainState& s = m.state;
    s.step = meta.at("step").get<int64_t>();
    s.tokens = meta.at("tokens").get<int64_t>();
    s.elapsed_s = meta.at("elapsed_s").get<double>();
    s.best_val_loss = meta.at("best_val_loss").get<double>();
    s.best_val_step = meta.at("best_val_step").get<int64_t>();
    const json& l = meta.at("loader");
    s.loader = {l.at("shard").get<int64_t>(), l.at("offset").get<int64_t>(), l.at("shard_name").get<std::string>()};
    m.config_yaml = meta.at("config_yaml").get<std::string>();
    m.data_fingerprint = meta.value("data_fingerprint", std::string());
    const json& md = meta.at("model");
    m.model = {md.at("sequence_len").get<int64_t>(), md.at("vocab_size").get<int64_t>(),
               md.at("n_layer").get<int64_t>(), md.at("n_head").get<int64_t>(), md.at("n_embd").get<int64_t>()};
    if (md.contains("moe")) {
      const json& e = md.at("moe");
      m.model.moe = MoEConfig{e.at("n_experts").get<int64_t>(), e.at("top_k").get<int64_t>(),
                              e.at("expert_dim").get<int64_t>(), e.at("n_shared_experts").get<int64_t>(),
                              e.at("every").get<int64_t>(), e.at("sigmoid").get<bool>()};
    }
    const json& lay = meta.at("layout");
    m.dp_size = lay.at("dp_size").get<int64_t>();
    m.fs_size = lay.at("fs_size").get<int64_t>();
    m.tp_size = lay.at("tp_size").get<int64_t>();
    const int64_t world = lay.at("world_size").get<int64_t>();
    if (m.dp_size < 1 || m.fs_size < 1 || m.tp_size < 1 || world < 1 || world > (1 << 20) ||
        m.dp_size * m.fs_size * m.tp_size != world)
      return bad("layout", lay.dump(), "dp_size x fs_size x tp_size = world_size, each >= 1");
    // The checkpoint's own configuration: num_iterations, batch_size, sequence_length.
    YAML::Node cfg;
    try {
      cfg = YAML::Load(m.config_yaml);
    } catch (const YAML::Exception& e) {
      return fmt::format("'{}': key 'config_yaml' is not valid YAML: {}", f, e.what());
    }
    int64_t n_iter = 0, batch = 0, seq = 0;
    try {
      n_iter = cfg["num_iterations"].as<int64_t>();
      batch = cfg["batch_size"].as<int64_t>();
      seq = cfg["sequence_length"].as<int64_t>();
    } catch (const YAML::Exception&) {
      return fmt::format("'{}': key 'config_yaml' lacks an integer num_iterations, batch_size or sequence_length", f);
    }
    if (n_iter < 1 || batch < 1 || seq < 1 || seq != m.model.sequence_len)
      return bad("config_yaml", fmt::format("num_iterations {} batch_size {} sequence_length {}", n_iter, batch, seq),
                 fmt::format("values >= 1, sequence_length = model.sequence_len {}", m.model.sequence_len));
    if (s.step < 0 || s.step >= n_iter)
      return bad(
          "step", std::to_string(s.step),
          fmt::format("0 <= step < the checkpoint's num_iterations {} (a checkpoint is written after a step)", n_iter));
    int64_t want_tokens = 0;
    if (__builtin_mul_overflow(s.step + 1, batch * seq, &want_tokens) || s.tokens != want_tokens)
      return bad("tokens", std::to_string(s.tokens),
                 fmt::format("(step + 1) x batch_size x sequence_length = {} x {} x {}", s.step + 1, batch, seq));
    if (!std::isfinite(s.elapsed_s) || s.elapsed_s < 0)
      return bad("elapsed_s", fmt::format("{}", s.elapsed_s), "a number >= 0");
    if (s.best_val_step < -1 || s.best_val_step > s.step + 1)
      return bad("best_val_step", std::to_string(s.best_val_step),
                 fmt::format("-1 (none) to step + 1 = {}", s.step + 1));
    if (!std::isfinite(s.best_val_loss) || s.best_val_loss < 0)
      return bad("best_val_loss", fmt::format("{}", s.best_val_loss), "a number >= 0");
    if (s.loader.shard < 0 || s.loader.offset < 0) return bad("loader", l.dump(), "shard >= 0 and offset >= 0");
    if (m.model.vocab_size < 1 || m.model.n_layer < 1 || m.model.n_head < 1 || m.model.n_embd < 1)
      return bad("model", md.dump(), "every size >= 1");
    if (out) *out = m;
  } catch (const json::exception& e) {
    return fmt::format("'{}' is malformed (a key missing or of the wrong type): {}", f, e.what());
  }
  return "";
}

}  // namespace

// The whole check of checkpoint.h; `out` gets meta.json's values when it passes.
std::string detail::verify(const fs::path& ckpt, CheckpointMeta* out) {
  std::error_code ec;
  if (!fs::is_directory(ckpt, ec)) return fmt::format("'{}' is not a folder", ckpt.string());
  const fs::path meta_file = ckpt / "meta.json";
  std::optional<Manifest> manifest;
  try {
    manifest = manifest_read(ckpt);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  if (!manifest) {
    if (!fs::exists(meta_file, ec))
      return fmt::format(
          "'{}' has neither manifest.json nor meta.json: not a checkpoint, or its write never "
          "finished, or its files were removed",
          ckpt.string());
    // Version 1 (no checksums): the structure only.
    std::ifstream f(meta_file);
    json meta;
    try {
      meta = json::parse(f);
    } catch (const json::exception& e) {
      return fmt::format("'{}' is malformed: {}", meta_file.string(), e.what());
    }
    if (meta.value("version", 0) != 1)
      return fmt::format(
          "'{}' has no manifest.json (it is written last: the checkpoint is incomplete, or the file "
          "was removed)",
          ckpt.string());
    CheckpointMeta m;
    if (std::string p = meta_problem(meta, meta_file, &m); !p.empty()) return p;
    for (const std::string& name : expected_files(int(m.dp_size * m.fs_size * m.tp_size)))
      if (!fs::exists(ckpt / name, ec)) return fmt::format("'{}' is missing", (ckpt / name).string());
    if (out) *out = m;
    return "";
  }
  const std::string where = (ckpt / kManifestFile).string();
  if (manifest->version != kCheckpointVersion)
    return fmt::format("'{}': version {}; this program writes and verifies version {}", where, manifest->version,
                       kCheckpointVersion);
  // The folder holds exactly the manifest's files (exports, *.safetensors, aside).
  std::set<std::string> present;
  for (const auto& entry : fs::directory_iterator(ckpt, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kManifestFile || is_export(name)) continue;
    if (!manifest->files.count(name))
      return fmt::format(
          "'{}' is not listed in '{}': a leftover or a file copied in; a checkpoint folder holds only "
          "its own files (remove it, or move the folder aside)",
          entry.path().string(), where);
    present.insert(name);
  }
  for (const auto& [name, d] : manifest->files)
    if (!present.count(name)) return fmt::format("'{}' is missing (listed in '{}')", (ckpt / name).string(), where);
  // meta.json: its bytes first, then its values, then the file set its layout needs.
  json meta;
  try {
    auto it = manifest->files.find("meta.json");
    if (it == manifest->files.end()) return fmt::format("'{}' does not list meta.json", where);
    meta = json::parse(read_file_checked(meta_file, it->second));
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const json::exception& e) {
    return fmt::format("'{}' is malformed: {}", meta_file.string(), e.what());
  }
  CheckpointMeta m;
  if (std::string p = meta_problem(meta, meta_file, &m); !p.empty()) return p;
  if (m.version != kCheckpointVersion)
    return fmt::format("'{}': version {} beside a manifest of version {}", meta_file.string(), m.version,
                       kCheckpointVersion);
  const int world = int(m.dp_size * m.fs_size * m.tp_size);
  const std::set<std::string> want = expected_files(world);
  for (const std::string& name : want)
    if (!manifest->files.count(name))
      return fmt::format("'{}' lacks '{}': a checkpoint of {} process(es) has {} files", where, name, world,
                         want.size());
  for (const auto& [name, d] : manifest->files)
    if (!want.count(name))
      return fmt::format("'{}' lists '{}', which a checkpoint of {} process(es) does not have", where, name, world);
  // Every other file's size and CRC-32.
  for (const auto& [name, d] : manifest->files) {
    if (name == "meta.json") continue;
    try {
      const FileDigest got = file_digest(ckpt / name);
      if (got.size != d.size)
        return fmt::format("'{}' has {} bytes, '{}' says {}: the file is truncated or was replaced",
                           (ckpt / name).string(), got.size, where, d.size);
      if (got.crc32 != d.crc32)
        return fmt::format(
            "'{}': CRC-32 {:08x} but '{}' says {:08x}: the file is corrupt (changed since it was "
            "written)",
            (ckpt / name).string(), got.crc32, where, d.crc32);
    } catch (const CheckpointError& e) {
      return e.what();
    }
  }
  if (out) *out = m;
  remember_good(ckpt);
  return "";
}

namespace {

void warn_legacy(const fs::path& ckpt, const CheckpointMeta& m) {
  if (m.version == 1)
    std::fprintf(stderr,
                 "dion-train: warning: %s is a version-1 checkpoint (written before checksums, no "
                 "manifest.json): its files cannot be verified; loading them as they are\n",
                 ckpt.string().c_str());
}

}  // namespace

std::string checkpoint_problem(const fs::path& ckpt) { return verify(ckpt, nullptr); }

CheckpointMeta checkpoint_read_meta(const fs::path& ckpt) {
  CheckpointMeta m;
  const std::string problem = verify(ckpt, &m);
  if (!problem.empty())
    throw CheckpointError(fmt::format("checkpoint '{}' is not a complete good checkpoint: {}", ckpt.string(), problem));
  warn_legacy(ckpt, m);
  return m;
}

CheckpointChoice checkpoint_choose(const fs::path& dir, bool fallback) {
  CheckpointChoice out;
  const auto dirs = step_dirs(dir);
  for (const auto& [step, p] : dirs) {
    CheckpointMeta m;
    const std::string problem = verify(p, &m);
    if (problem.empty()) {
      if (m.state.step != step)
        throw CheckpointError(
            fmt::format("checkpoint '{}': meta.json says step {}, the folder's name step {}: "
                        "renamed by hand? Rename it back to {}",
                        p.string(), m.state.step, step, step_name(m.state.step)));
      warn_legacy(p, m);
      out.chosen = p;
      out.meta = m;
      return out;
    }
    if (!fallback)
      throw CheckpointError(fmt::format(
          "checkpoint_dir '{}': the newest checkpoint {} is not a complete good checkpoint: {}. Nothing was loaded "
          "and nothing removed. Repair or move that folder, or run with --resume_fallback true to resume from the "
          "newest good checkpoint ({} older step_* folder(s) here), or --resume false to start over",
          dir.string(), p.filename().string(), problem, dirs.size() - 1));
    out.skipped.emplace_back(p, problem);
  }
  return out;
}

fs::path checkpoint_resolve(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path / "meta.json", ec) || fs::exists(path / kManifestFile, ec)) return path;
  auto latest = checkpoint_find_latest(path);
  if (!latest)
    throw CheckpointError(
        fmt::format("--checkpoint '{}': neither a checkpoint (no meta.json) nor a folder holding "
                    "one (step_* folders)",
                    path.string()));
  return *latest;
}

}  // namespace dion::train
