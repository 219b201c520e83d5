// src/train/io/checkpoint_write.cpp — writing a checkpoint: free space, every rank's files, the
// ranks' agreement, meta.json and manifest.json, the commit (rename) and rotation (checkpoint.h).
#include "dion/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
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

// ---------------------------------------------------------------------------- parallel agreement

// True when every rank passes ok (one all_gather: also the barrier the commit protocol needs).
// The failing ranks' numbers in `bad`.
bool all_ok(Parallel* par, bool ok, std::vector<int>* bad = nullptr) {
  if (!par || par->mesh().world_size() == 1) {
    if (!ok && bad) bad->push_back(0);
    return ok;
  }
  at::Tensor all = par->mesh().world().all_gather(at::tensor({int64_t(ok)}, at::kLong)).reshape({-1});
  bool every = true;
  for (int r = 0; r < par->mesh().world_size(); ++r)
    if (all[r].item<int64_t>() == 0) {
      every = false;
      if (bad) bad->push_back(r);
    }
  return every;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// ---------------------------------------------------------------------------- free space

int64_t free_bytes(const fs::path& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return -1;
  return int64_t(v.f_bavail) * int64_t(v.f_frsize);
}

std::string mb(int64_t bytes) { return fmt::format("{:.1f} MB", double(bytes) / 1e6); }

// The bytes the next checkpoint needs: the newest complete one's total size, else an estimate
// (the model's bytes x 3: weights, and up to two optimizer states per weight).
int64_t needed_bytes(const fs::path& dir, int64_t model_bytes, std::string* basis) {
  for (const auto& [step, p] : step_dirs(dir)) {
    try {
      if (auto m = manifest_read(p)) {
        int64_t total = 0;
        for (const auto& [name, d] : m->files) total += d.size;
        *basis = fmt::format("the size of the newest checkpoint, {}", p.filename().string());
        return total;
      }
    } catch (const CheckpointError&) {
    }
  }
  *basis = "an estimate: 3 x the model's bytes";
  return 3 * model_bytes;
}

// ---------------------------------------------------------------------------- this rank's files

struct RankDigests {
  FileDigest d[3];
};

RankDigests write_rank_files(const fs::path& tmp, GPT& model, const dion::Optimizer& optimizer, int world, int rank) {
  RankDigests out;
  out.d[0] = write_file_checked(tmp / rank_file(world, rank, "model"), [&](const Sink& sink) {
    torch::serialize::OutputArchive ar;  // name -> this rank's part (whole for one process), CPU
    for (const auto& item : model->named_parameters()) ar.write(item.key(), item.value().detach().to(at::kCPU));
    // Buffers (an MoE's expert_bias), whole and equal on every rank.
    for (const auto& item : model->named_buffers()) ar.write(item.key(), item.value().detach().to(at::kCPU));
    ar.save_to(sink);
  });
  out.d[1] = write_file_checked(tmp / rank_file(world, rank, "optimizer"), [&](const Sink& sink) {
    torch::serialize::OutputArchive ar;
    optimizer.save(ar);
    ar.save_to(sink);
  });
  out.d[2] = write_file_checked(tmp / rank_file(world, rank, "rng"), [&](const Sink& sink) {
    torch::serialize::OutputArchive ar;
    auto cpu_gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpu_gen.mutex());
      ar.write("cpu", cpu_gen.get_state());
    }
    if (at::globalContext().hasCUDA()) {
      auto cuda_gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA));
      std::lock_guard<std::mutex> lock(cuda_gen.mutex());
      ar.write("cuda", cuda_gen.get_state());
    }
    ar.save_to(sink);
  });
  return out;
}

json make_meta(GPT& model, const TrainState& s, const std::string& config_yaml, Parallel* par, int world,
               const std::string& data_fingerprint) {
  json params = json::array();
  for (const auto& item : model->named_parameters()) {
    json p = {{"name", item.key()},
              {"shape", item.value().sizes().vec()},
              {"dtype", std::string(c10::toString(item.value().scalar_type()))}};
    if (world > 1) {
      const Placement& pl = par->placement(item.value());
      p["shape"] = pl.global_shape;
      for (const SplitField& f : split_fields())
        if (f.always || pl.*f.field != f.unsplit) p[f.key] = pl.*f.field;
    }
    params.push_back(p);
  }
  const MeshShape mesh = par ? par->mesh().shape() : MeshShape{};
  const GPTConfig& m = model->config();
  json model_json = {{"vocab_size", m.vocab_size},
                     {"n_layer", m.n_layer},
                     {"n_head", m.n_head},
                     {"n_embd", m.n_embd},
                     {"sequence_len", m.sequence_len}};
  if (m.moe.n_experts > 0)  // the MoE's shape (moe.h): sample / export rebuild the model from it
    model_json["moe"] = {{"n_experts", m.moe.n_experts},   {"top_k", m.moe.top_k},
                         {"expert_dim", m.moe.expert_dim}, {"n_shared_experts", m.moe.n_shared_experts},
                         {"every", m.moe.every},           {"sigmoid", m.moe.sigmoid}};
  return {
      {"format", "dion-train checkpoint"},
      {"version", kCheckpointVersion},
      {"step", s.step},
      {"tokens", s.tokens},
      {"elapsed_s", s.elapsed_s},
      {"best_val_loss", s.best_val_loss},
      {"best_val_step", s.best_val_step},
      {"loader", {{"shard", s.loader.shard}, {"offset", s.loader.offset}, {"shard_name", s.loader.shard_name}}},
      {"layout",
       {{"dp_size", mesh.dp},
        {"fs_size", mesh.fs},
        {"tp_size", mesh.tp},
        {"ep_size", mesh.ep},
        {"world_size", world},
        {"note", world == 1 ? "tensors are whole (global shapes); one file per checkpoint"
                            : "rank_RRRRR.*.pt per rank: its parts of the tensors (fs_dim, tp_dim: "
                              "FSDP2 chunks over fs and tp, mesh (dp, fs, tp) with tp fastest)"}}},
      {"model", model_json},
      {"params", params},
      {"data_fingerprint", data_fingerprint},
      {"config_yaml", config_yaml},
  };
}

// "" when `p` holds exactly its manifest's files with their sizes (no checksums: the cheap check
// of rotation), else what is wrong.
std::string structure_problem(const fs::path& p) {
  try {
    const std::optional<Manifest> m = manifest_read(p);
    if (!m) return "no manifest.json";
    std::set<std::string> seen;
    for (const auto& f : fs::directory_iterator(p)) {
      const std::string name = f.path().filename().string();
      if (name == kManifestFile || is_export(name)) continue;
      seen.insert(name);
      auto it = m->files.find(name);
      if (it == m->files.end()) return fmt::format("'{}' is not in its manifest", name);
      if (int64_t(fs::file_size(f.path())) != it->second.size)
        return fmt::format("'{}' has another size than its manifest says", name);
    }
    for (const auto& [name, d] : m->files)
      if (!seen.count(name)) return fmt::format("'{}' is missing", name);
  } catch (const std::exception& e) {
    return error_text(e);
  }
  return "";
}

// "" when `p` is a checkpoint that may be removed (or replaced): known good and still complete,
// or verified whole now; else what is wrong.
std::string removable_problem(const fs::path& p) {
  if (known_good(p)) return structure_problem(p);
  return verify(p, nullptr);
}

// Swaps `tmp` in as `final_dir`: a plain rename; when `final_dir` exists (the same step saved
// again) and is good, an atomic exchange (the old folder then sits at `tmp` and is removed),
// so that a kill never leaves the step without a complete folder; when it exists and is not
// complete, it is renamed aside to step_N.replaced-PID-TIME (never removed).
void commit_rename(const fs::path& tmp, const fs::path& final_dir) {
  if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return;
  const int err = errno;
  if (err == EEXIST || err == ENOTEMPTY) {
    const std::string problem = removable_problem(final_dir);
    if (!problem.empty()) {
      const fs::path aside = final_dir.string() + fmt::format(".replaced-{}-{}", ::getpid(), ::time(nullptr));
      if (::rename(final_dir.c_str(), aside.c_str()) != 0)
        throw CheckpointError(fmt::format("cannot move the incomplete '{}' ({}) aside to '{}': {}", final_dir.string(),
                                          problem, aside.string(), std::strerror(errno)));
      std::fprintf(stderr,
                   "dion-train: note: moved %s aside to %s: it was not a complete checkpoint (%s) and a new "
                   "checkpoint of its step takes its place; look at it, then remove it yourself\n",
                   final_dir.string().c_str(), aside.string().c_str(), problem.c_str());
      if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return;
    } else {
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        remove_tree(tmp);
        return;
      }
      remove_tree(final_dir);  // a file system without RENAME_EXCHANGE
      if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return;
    }
  }
  throw CheckpointError(
      fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), final_dir.string(), std::strerror(errno)));
}

// After the commit of `step` (rank 0): tmp.* leftovers and older complete checkpoints go (each
// renamed to tmp.rotated.step_N before it is removed); newer folders stay; incomplete ones stay,
// each named in a note.
void rotate(const fs::path& dir, int64_t step) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& entry : fs::directory_iterator(dir, ec)) entries.push_back(entry.path());
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    int64_t s = 0;
    if (name.rfind("tmp.", 0) == 0) {
      remove_tree(p);
    } else if (is_step_dir(p, &s) && s < step) {
      const std::string why = removable_problem(p);
      if (why.empty()) {
        // Renamed to a tmp.* name first (atomic), then removed: a kill during the removal leaves
        // a tmp.* leftover, which the next rotation removes, never a half-removed step_* folder
        // that would look like a damaged checkpoint and be kept forever.
        const fs::path doomed = dir / ("tmp.rotated." + name);
        remove_tree(::rename(p.c_str(), doomed.c_str()) == 0 ? doomed : p);
      } else
        std::fprintf(stderr,
                     "dion-train: note: kept %s: not a complete checkpoint (%s); it is never removed "
                     "automatically: look at it, then remove it yourself\n",
                     p.string().c_str(), why.c_str());
    }
  }
}

}  // namespace

void checkpoint_dir_check_writable(const fs::path& dir) {
  const std::string key = fmt::format("key 'checkpoint_dir' ('{}')", dir.string());
  std::error_code ec;
  fs::path probe_in = fs::absolute(dir, ec);
  if (ec) probe_in = dir;
  // The folder itself, or its nearest existing parent (the first save creates the rest).
  while (!fs::exists(probe_in, ec) && probe_in.has_parent_path() && probe_in != probe_in.parent_path())
    probe_in = probe_in.parent_path();
  if (!fs::is_directory(probe_in, ec))
    throw CheckpointError(fmt::format("{}: {} is a file, not a folder, so no checkpoint could be written; valid: a "
                                      "folder (created when missing) or an empty value for no checkpoints",
                                      key, probe_in.string()));
  const std::string tmpl = (probe_in / ".dion-train-probe-XXXXXX").string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) {
    const int err = errno;
    throw CheckpointError(fmt::format("{}: cannot create a file in {} ({}), so no checkpoint could be written; "
                                      "choose a writable folder, or an empty value for no checkpoints",
                                      key, probe_in.string(), std::strerror(err)));
  }
  ::close(fd);
  ::unlink(name.data());
}

fs::path checkpoint_save(const fs::path& dir, GPT& model, const dion::Optimizer& optimizer, const TrainState& s,
                         const std::string& config_yaml, Parallel* par, const std::string& data_fingerprint) {
  const int world = par ? par->mesh().world_size() : 1;
  const int rank = par ? par->mesh().rank() : 0;
  const bool main = rank == 0;
  const fs::path final_dir = dir / step_name(s.step);
  std::optional<fs::path> previous;
  for (const auto& [st, p] : step_dirs(dir))
    if (st != s.step) {
      previous = p;
      break;
    }
  const std::string intact = previous
                                 ? fmt::format("the newest earlier checkpoint, {}, is untouched", previous->string())
                                 : std::string("no earlier checkpoint was touched");
  int64_t model_bytes = 0;
  for (const auto& item : model->named_parameters())
    model_bytes += item.value().numel() * int64_t(item.value().element_size()) * world;
  std::string basis;
  const int64_t needed = main ? needed_bytes(dir, model_bytes, &basis) : 0;
  auto space_text = [&] {
    const int64_t free = free_bytes(dir);
    return fmt::format("{} free in '{}'; a checkpoint needs about {} ({})", free < 0 ? std::string("?") : mb(free),
                       dir.string(), mb(needed), basis);
  };

  // 1. Rank 0 makes the temp folder (after checking the free space).
  fs::path tmp = dir / ("tmp." + step_name(s.step));  // the same name on every rank (shared file system)
  std::string error;
  if (main) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec || !fs::is_directory(dir))
        throw CheckpointError(fmt::format("checkpoint_dir '{}' cannot be created: {}", dir.string(), ec.message()));
      const int64_t free = free_bytes(dir);
      if (free >= 0 && free < needed)
        throw CheckpointError(
            fmt::format("not enough space to write checkpoint {}: {}. Free some space (or "
                        "choose another checkpoint_dir) and run the same command again; {}",
                        step_name(s.step), space_text(), intact));
      if (world == 1) {
        std::string templ = (dir / "tmp.XXXXXX").string();
        if (!::mkdtemp(templ.data()))
          throw CheckpointError(fmt::format("cannot create a folder in '{}': {}", dir.string(), std::strerror(errno)));
        tmp = templ;
      } else {
        remove_tree(tmp);  // the leftover of a save that was killed
        if (::mkdir(tmp.c_str(), 0755) != 0)
          throw CheckpointError(fmt::format("cannot create '{}': {}", tmp.string(), std::strerror(errno)));
      }
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  if (!all_ok(par, error.empty()))
    throw CheckpointError(
        main ? error : fmt::format("rank 0 could not start checkpoint {} (its log says why)", step_name(s.step)));

  // 2. Every rank writes its files; then ok flags and checksums are exchanged.
  RankDigests mine;
  try {
    mine = write_rank_files(tmp, model, optimizer, world, rank);
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  std::vector<int> bad;
  const bool written = all_ok(par, error.empty(), &bad);
  at::Tensor digests = at::empty({6}, at::kLong);
  for (int i = 0; i < 3; ++i) {
    digests[2 * i] = mine.d[i].size;
    digests[2 * i + 1] = int64_t(mine.d[i].crc32);
  }
  if (written && world > 1)
    digests = par->mesh().world().all_gather(digests).reshape({world, 6});
  else
    digests = digests.reshape({1, 6});
  auto fail = [&](const std::string& what) {
    if (main) remove_tree(tmp);
    throw CheckpointError(fmt::format("{}; the unfinished '{}' was removed and {}", what, tmp.string(), intact));
  };
  if (!written) {
    if (!error.empty())
      fail(fmt::format("checkpoint {} could not be written: {}; {}", step_name(s.step), error, space_text()));
    fail(fmt::format("checkpoint {} could not be written: rank(s) {} failed to write their files (their logs say why)",
                     step_name(s.step), rank_list(bad)));
  }

  // 3. Rank 0 commits: meta.json, manifest.json last, rename.
  if (main) {
    try {
      Manifest manifest;
      manifest.version = kCheckpointVersion;
      for (int r = 0; r < world; ++r)
        for (int i = 0; i < 3; ++i)
          manifest.files[rank_file(world, r, kRankFiles[i])] = {digests[r][2 * i].item<int64_t>(),
                                                                uint32_t(digests[r][2 * i + 1].item<int64_t>())};
      const std::string meta = make_meta(model, s, config_yaml, par, world, data_fingerprint).dump(2) + "\n";
      manifest.files["meta.json"] =
          write_file_checked(tmp / "meta.json", [&](const Sink& sink) { sink(meta.data(), meta.size()); });
      manifest_write(tmp, manifest);
      fsync_path(tmp);
      commit_rename(tmp, final_dir);
      try {
        fsync_path(dir);  // makes the rename durable; best effort (committed either way)
      } catch (const CheckpointError&) {
      }
    } catch (const std::exception& e) {
      error = error_text(e);
    }
  }
  if (!all_ok(par, error.empty())) {
    if (main) fail(fmt::format("checkpoint {} could not be committed: {}; {}", step_name(s.step), error, space_text()));
    fail(fmt::format("rank 0 could not commit checkpoint {} (its log says why)", step_name(s.step)));
  }
  // 4. Only now: remove older good checkpoints and leftovers of killed writes.
  remember_good(final_dir);
  if (main) rotate(dir, s.step);
  return final_dir;
}

std::optional<fs::path> checkpoint_find_latest(const fs::path& dir) {
  const auto dirs = step_dirs(dir);
  if (dirs.empty()) return std::nullopt;
  return dirs.front().second;
}

}  // namespace dion::train
