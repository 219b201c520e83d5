// src/train/checkpoint.cpp — checkpoint write (temp folder, manifest, rename, rotation), verify,
// choose, read (checkpoint.h).
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
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "dion/comm/group.h"
#include "dion/train/checkpoint_files.h"
#include "dion/train/fs_util.h"
#include "dion/train/parallel.h"

namespace dion::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
constexpr const char* kRankFiles[] = {"model", "optimizer", "rng"};

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
        throw CheckpointError(fmt::format("'{}' is not listed in '{}'", file.string(), (ckpt / kManifestFile).string()));
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

// ---------------------------------------------------------------------------- parallel agreement

// True when every rank passes ok (one all_gather: also the barrier the commit protocol needs).
// The failing ranks' numbers in `bad`.
bool all_ok(Parallel* par, bool ok, std::vector<int>* bad = nullptr) {
  if (!par || par->world_size() == 1) {
    if (!ok && bad) bad->push_back(0);
    return ok;
  }
  at::Tensor all = par->world().all_gather(at::tensor({int64_t(ok)}, at::kLong)).reshape({-1});
  bool every = true;
  for (int r = 0; r < par->world_size(); ++r)
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
  struct statvfs v{};
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
      const ParamPlacement& pl = par->placement(item.value());
      p["shape"] = pl.global_shape;
      p["fs_dim"] = pl.fs_dim;
      p["tp_dim"] = pl.tp_dim;
    }
    params.push_back(p);
  }
  const MeshShape mesh = par ? par->shape() : MeshShape{};
  const GPTConfig& m = model->config();
  return {
      {"format", "dion-train checkpoint"},
      {"version", kCheckpointVersion},
      {"step", s.step},
      {"tokens", s.tokens},
      {"elapsed_s", s.elapsed_s},
      {"best_val_loss", s.best_val_loss},
      {"best_val_step", s.best_val_step},
      {"loader", {{"shard", s.loader.shard}, {"offset", s.loader.offset}, {"shard_name", s.loader.shard_name}}},
      {"layout", {{"dp_size", mesh.dp}, {"fs_size", mesh.fs}, {"tp_size", mesh.tp}, {"world_size", world},
                  {"note", world == 1 ? "tensors are whole (global shapes); one file per checkpoint"
                                      : "rank_RRRRR.*.pt per rank: its parts of the tensors (fs_dim, tp_dim: "
                                        "FSDP2 chunks over fs and tp, mesh (dp, fs, tp) with tp fastest)"}}},
      {"model", {{"vocab_size", m.vocab_size}, {"n_layer", m.n_layer}, {"n_head", m.n_head},
                 {"n_embd", m.n_embd}, {"sequence_len", m.sequence_len}}},
      {"params", params},
      {"data_fingerprint", data_fingerprint},
      {"config_yaml", config_yaml},
  };
}

// Exports (`dion-train export` writes CKPT/model.safetensors, atomically through a temp file)
// may sit in a checkpoint folder without being part of it.
bool is_export(const std::string& name) { return name.find(".safetensors") != std::string::npos; }

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
      if (int64_t(fs::file_size(f.path())) != it->second.size) return fmt::format("'{}' has another size than its manifest says", name);
    }
    for (const auto& [name, d] : m->files)
      if (!seen.count(name)) return fmt::format("'{}' is missing", name);
  } catch (const std::exception& e) {
    return error_text(e);
  }
  return "";
}

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
std::string verify(const fs::path& ckpt, CheckpointMeta* out);  // below

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
      std::fprintf(stderr, "dion-train: note: moved %s aside to %s: it was not a complete checkpoint (%s) and a new "
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
  throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), final_dir.string(),
                                    std::strerror(errno)));
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
        std::fprintf(stderr, "dion-train: note: kept %s: not a complete checkpoint (%s); it is never removed "
                     "automatically: look at it, then remove it yourself\n", p.string().c_str(), why.c_str());
    }
  }
}

}  // namespace

fs::path checkpoint_save(const fs::path& dir, GPT& model, const dion::Optimizer& optimizer, const TrainState& s,
                         const std::string& config_yaml, Parallel* par, const std::string& data_fingerprint) {
  const int world = par ? par->world_size() : 1;
  const int rank = par ? par->rank() : 0;
  const bool main = rank == 0;
  const fs::path final_dir = dir / step_name(s.step);
  std::optional<fs::path> previous;
  for (const auto& [st, p] : step_dirs(dir))
    if (st != s.step) {
      previous = p;
      break;
    }
  const std::string intact = previous ? fmt::format("the newest earlier checkpoint, {}, is untouched", previous->string())
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
        throw CheckpointError(fmt::format("not enough space to write checkpoint {}: {}. Free some space (or "
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
    throw CheckpointError(main ? error : fmt::format("rank 0 could not start checkpoint {} (its log says why)", step_name(s.step)));

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
  if (written && world > 1) digests = par->world().all_gather(digests).reshape({world, 6});
  else digests = digests.reshape({1, 6});
  auto fail = [&](const std::string& what) {
    if (main) remove_tree(tmp);
    throw CheckpointError(fmt::format("{}; the unfinished '{}' was removed and {}", what, tmp.string(), intact));
  };
  if (!written) {
    if (!error.empty()) fail(fmt::format("checkpoint {} could not be written: {}; {}", step_name(s.step), error, space_text()));
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
      manifest.files["meta.json"] = write_file_checked(tmp / "meta.json", [&](const Sink& sink) { sink(meta.data(), meta.size()); });
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
    m.model = {md.at("sequence_len").get<int64_t>(), md.at("vocab_size").get<int64_t>(), md.at("n_layer").get<int64_t>(),
               md.at("n_head").get<int64_t>(), md.at("n_embd").get<int64_t>()};
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
      return bad("step", std::to_string(s.step),
                 fmt::format("0 <= step < the checkpoint's num_iterations {} (a checkpoint is written after a step)", n_iter));
    int64_t want_tokens = 0;
    if (__builtin_mul_overflow(s.step + 1, batch * seq, &want_tokens) || s.tokens != want_tokens)
      return bad("tokens", std::to_string(s.tokens),
                 fmt::format("(step + 1) x batch_size x sequence_length = {} x {} x {}", s.step + 1, batch, seq));
    if (!std::isfinite(s.elapsed_s) || s.elapsed_s < 0) return bad("elapsed_s", fmt::format("{}", s.elapsed_s), "a number >= 0");
    if (s.best_val_step < -1 || s.best_val_step > s.step + 1)
      return bad("best_val_step", std::to_string(s.best_val_step), fmt::format("-1 (none) to step + 1 = {}", s.step + 1));
    if (!std::isfinite(s.best_val_loss) || s.best_val_loss < 0)
      return bad("best_val_loss", fmt::format("{}", s.best_val_loss), "a number >= 0");
    if (s.loader.shard < 0 || s.loader.offset < 0)
      return bad("loader", l.dump(), "shard >= 0 and offset >= 0");
    if (m.model.vocab_size < 1 || m.model.n_layer < 1 || m.model.n_head < 1 || m.model.n_embd < 1)
      return bad("model", md.dump(), "every size >= 1");
    if (out) *out = m;
  } catch (const json::exception& e) {
    return fmt::format("'{}' is malformed (a key missing or of the wrong type): {}", f, e.what());
  }
  return "";
}

// The whole check of checkpoint.h; `out` gets meta.json's values when it passes.
std::string verify(const fs::path& ckpt, CheckpointMeta* out) {
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
      return fmt::format("'{}' has neither manifest.json nor meta.json: not a checkpoint, or its write never "
                         "finished, or its files were removed", ckpt.string());
    // Version 1 (no checksums): the structure only.
    std::ifstream f(meta_file);
    json meta;
    try {
      meta = json::parse(f);
    } catch (const json::exception& e) {
      return fmt::format("'{}' is malformed: {}", meta_file.string(), e.what());
    }
    if (meta.value("version", 0) != 1)
      return fmt::format("'{}' has no manifest.json (it is written last: the checkpoint is incomplete, or the file "
                         "was removed)", ckpt.string());
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
      return fmt::format("'{}' is not listed in '{}': a leftover or a file copied in; a checkpoint folder holds only "
                         "its own files (remove it, or move the folder aside)", entry.path().string(), where);
    present.insert(name);
  }
  for (const auto& [name, d] : manifest->files)
    if (!present.count(name))
      return fmt::format("'{}' is missing (listed in '{}')", (ckpt / name).string(), where);
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
      return fmt::format("'{}' lacks '{}': a checkpoint of {} process(es) has {} files", where, name, world, want.size());
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
        return fmt::format("'{}': CRC-32 {:08x} but '{}' says {:08x}: the file is corrupt (changed since it was "
                           "written)", (ckpt / name).string(), got.crc32, where, d.crc32);
    } catch (const CheckpointError& e) {
      return e.what();
    }
  }
  if (out) *out = m;
  remember_good(ckpt);
  return "";
}

void warn_legacy(const fs::path& ckpt, const CheckpointMeta& m) {
  if (m.version == 1)
    std::fprintf(stderr, "dion-train: warning: %s is a version-1 checkpoint (written before checksums, no "
                 "manifest.json): its files cannot be verified; loading them as they are\n", ckpt.string().c_str());
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
        throw CheckpointError(fmt::format("checkpoint '{}': meta.json says step {}, the folder's name step {}: "
                                          "renamed by hand? Rename it back to {}", p.string(), m.state.step, step,
                                          step_name(m.state.step)));
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
    throw CheckpointError(fmt::format("--checkpoint '{}': neither a checkpoint (no meta.json) nor a folder holding "
                                      "one (step_* folders)", path.string()));
  return *latest;
}

namespace {

// The layout a checkpoint was written at (meta.json "layout" and the parameters' placements).
struct SavedLayout {
  MeshShape mesh;
  int world = 1;
  std::map<std::string, ParamPlacement> params;
};

SavedLayout read_layout(const fs::path& ckpt) {
  const fs::path file = ckpt / "meta.json";
  std::ifstream f(file);
  if (!f) throw CheckpointError(fmt::format("checkpoint '{}': no meta.json", ckpt.string()));
  SavedLayout out;
  try {
    const json meta = json::parse(f);
    const json& l = meta.at("layout");
    out.mesh = {l.at("dp_size"), l.at("fs_size"), l.at("tp_size")};
    out.world = l.at("world_size");
    if (out.world != out.mesh.world() || out.world < 1)
      throw CheckpointError(fmt::format("'{}': layout dp {} x fs {} x tp {} does not match its world size {}",
                                        file.string(), out.mesh.dp, out.mesh.fs, out.mesh.tp, out.world));
    for (const json& p : meta.at("params")) {
      ParamPlacement pl{p.at("name"), p.at("shape").get<std::vector<int64_t>>()};
      pl.fs_dim = p.value("fs_dim", int64_t(-1));
      pl.tp_dim = p.value("tp_dim", int64_t(-1));
      out.params[pl.name] = pl;
    }
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed: {}", file.string(), e.what()));
  }
  return out;
}

}  // namespace

namespace {
void load_model(const fs::path& ckpt, GPT& model, const Parallel* par) {
  const SavedLayout saved = read_layout(ckpt);
  // The saved parts that cover every tensor: the ranks of dp index 0 (dp replicas are equal).
  struct Part {
    fs::path file;
    torch::serialize::InputArchive archive;
    int fs_rank = 0, tp_rank = 0;
  };
  std::vector<Part> parts;
  for (int64_t f = 0; f < saved.mesh.fs; ++f)
    for (int64_t t = 0; t < saved.mesh.tp; ++t) {
      const int r = int(f * saved.mesh.tp + t);  // mesh (dp, fs, tp) at dp index 0
      const std::string name = rank_file(saved.world, r, "model");
      parts.push_back({ckpt / name, open_archive(ckpt, name), int(f), int(t)});
    }
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    auto it = saved.params.find(name);
    if (it == saved.params.end())
      throw CheckpointError(fmt::format("'{}': no parameter '{}' in meta.json (a checkpoint of another model?)",
                                        (ckpt / "meta.json").string(), name));
    const ParamPlacement& sp = it->second;
    const std::vector<int64_t> want = par ? par->placement(item.value()).global_shape : item.value().sizes().vec();
    if (sp.global_shape != want)
      throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, the model's is {} (model_dim, n_layer, "
                                        "n_head must match the checkpoint's)",
                                        (ckpt / "meta.json").string(), name, shape_text(sp.global_shape),
                                        shape_text(want)));
    // Reassemble the whole tensor from the saved parts, then cut this rank's part.
    at::Tensor full;
    for (Part& part : parts) {
      at::Tensor t;
      if (!part.archive.try_read(name, t))
        throw CheckpointError(fmt::format("'{}': no tensor '{}' (a checkpoint of another model?)", part.file.string(), name));
      const Box box = local_box(sp, int(saved.mesh.fs), part.fs_rank, int(saved.mesh.tp), part.tp_rank);
      if (t.sizes().vec() != box.length)
        throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, its place in the layout says {}",
                                          part.file.string(), name, shape_text(t.sizes()), shape_text(box.length)));
      if (parts.size() == 1) {
        full = t;
        break;
      }
      if (!full.defined()) full = at::empty(sp.global_shape, t.options());
      at::Tensor dst = full;
      for (size_t d = 0; d < box.start.size(); ++d) dst = dst.narrow(int64_t(d), box.start[d], box.length[d]);
      dst.copy_(t);
    }
    at::Tensor mine = full;
    if (par && par->world_size() > 1) {
      const ParamPlacement& pl = par->placement(item.value());
      mine = local_part(full, pl, par->fs_group()->size(), par->fs_rank(), int(par->shape().tp), par->tp_rank());
    }
    item.value().copy_(mine);
  }
}

void load_training(const fs::path& ckpt, dion::Optimizer& optimizer) {
  const SavedLayout saved = read_layout(ckpt);
  {
    std::vector<torch::serialize::InputArchive> archives;
    for (int r = 0; r < saved.world; ++r) archives.push_back(open_archive(ckpt, rank_file(saved.world, r, "optimizer")));
    try {
      if (archives.size() == 1) optimizer.load(archives[0]);
      else optimizer.load(archives);
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("'{}': the optimizer state does not fit this run (same optimizer and "
                                        "model?): {}", (ckpt / rank_file(saved.world, 0, "optimizer")).string(), error_text(e)));
    }
  }
  const fs::path rng_file = ckpt / rank_file(saved.world, 0, "rng");  // rank 0's: the run's generator
  torch::serialize::InputArchive ar = open_archive(ckpt, rank_file(saved.world, 0, "rng"));
  at::Tensor cpu;
  if (!ar.try_read("cpu", cpu)) throw CheckpointError(fmt::format("'{}': no 'cpu' generator state", rng_file.string()));
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(cpu);
  }
  at::Tensor cuda;
  if (at::globalContext().hasCUDA() && ar.try_read("cuda", cuda)) {
    auto gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(cuda);
  }
}

}  // namespace

// Any other failure of torch while loading (a c10::Error: a tensor of another dtype, a
// generator state of another size) becomes a CheckpointError naming the checkpoint, without
// torch's C++ backtrace.
void checkpoint_load_model(const fs::path& ckpt, GPT& model, const Parallel* par) {
  try {
    load_model(ckpt, model, par);
  } catch (const CheckpointError&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': its model cannot be loaded: {}", ckpt.string(), error_text(e)));
  }
}

void checkpoint_load_training(const fs::path& ckpt, dion::Optimizer& optimizer) {
  try {
    load_training(ckpt, optimizer);
  } catch (const CheckpointError&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': its optimizer or generator state cannot be loaded: {}",
                                      ckpt.string(), error_text(e)));
  }
}

}  // namespace dion::train
