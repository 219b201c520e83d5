// src/train/io/checkpoint_common.cpp — the names and files of a checkpoint folder, reading an
// archive checked against its manifest, and the folders known good (checkpoint_detail.h).
#include "dion/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stdio.h>
#include <sys/stat.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "dion/comm/group.h"
#include "dion/train/checkpoint_files.h"
#include "dion/train/fs_util.h"
#include "dion/train/parallel.h"
#include "checkpoint_detail.h"

namespace dion::train::detail {

namespace fs = std::filesystem;

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw CheckpointError(fmt::format("cannot open '{}' to sync it", p.string()));
  ::fsync(fd);
  ::close(fd);
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out;
  for (int64_t d : sizes) {
    if (!out.empty()) out += 'x';
    out += std::to_string(d);
  }
  return out;
}

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }

bool is_step_dir(const fs::path& p, int64_t* step) {
  const std::string name = p.filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() != 13) return false;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  if (step) *step = std::stoll(name.substr(5));
  return true;
}

// The step_* folders of `dir`, newest first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int64_t step = 0;
    if (is_step_dir(entry.path(), &step)) out.emplace_back(step, entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// The files of one rank: "model.pt" for one process, "rank_00003.model.pt" in a parallel run.
std::string rank_file(int world, int rank, const char* what) {
  return world == 1 ? std::string(what) + ".pt" : fmt::format("rank_{:05d}.{}.pt", rank, what);
}

// Every file a checkpoint written by `world` processes holds besides manifest.json.
std::set<std::string> expected_files(int world) {
  std::set<std::string> out = {"meta.json"};
  for (int r = 0; r < world; ++r)
    for (const char* what : kRankFiles) out.insert(rank_file(world, r, what));
  return out;
}

// An archive from a checkpoint file: its bytes checked against the manifest (version 1: as is).
torch::serialize::InputArchive open_archive(const fs::path& ckpt, const std::string& name) {
  const fs::path file = ckpt / name;
  torch::serialize::InputArchive ar;
  const std::optional<Manifest> m = manifest_read(ckpt);
  try {
    if (m) {
      auto it = m->files.find(name);
      if (it == m->files.end())
        throw CheckpointError(
            fmt::format("'{}' is not listed in '{}'", file.string(), (ckpt / kManifestFile).string()));
      const std::string bytes = read_file_checked(file, it->second);
      ar.load_from(bytes.data(), bytes.size());
    } else {
      ar.load_from(file.string());
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint file '{}' cannot be read: {}", file.string(), error_text(e)));
  }
  return ar;
}

// Exports (`dion-train export` writes CKPT/model.safetensors, atomically through a temp file)
// may sit in a checkpoint folder without being part of it.
bool is_export(const std::string& name) { return name.find(".safetensors") != std::string::npos; }

// The folders this process wrote or verified whole: rotation removes them after the cheap
// structure check; any other folder is verified whole (checksums) before it may be removed.
std::mutex g_known_mutex;
std::set<std::string> g_known_good;
void remember_good(const fs::path& p) {
  std::lock_guard<std::mutex> lock(g_known_mutex);
  g_known_good.insert(fs::absolute(p).lexically_normal().string());
}
bool known_good(const fs::path& p) {
  std::lock_guard<std::mutex> lock(g_known_mutex);
  return g_known_good.count(fs::absolute(p).lexically_normal().string()) > 0;
}

}  // namespace dion::train::detail
