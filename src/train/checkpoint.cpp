// src/train/checkpoint.cpp — checkpoint write (temp folder + rename), find, read (checkpoint.h).
#include "dion/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>

#include "dion/comm/group.h"
#include "dion/train/fs_util.h"
#include "dion/train/parallel.h"
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

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

torch::serialize::InputArchive open_archive(const fs::path& file) {
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(file.string());
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint file '{}' cannot be read: {}", file.string(), e.what()));
  }
  return ar;
}

// The files of one rank: "model.pt" for one process, "rank_00003.model.pt" in a parallel run.
std::string rank_file(int world, int rank, const char* what) {
  return world == 1 ? std::string(what) + ".pt" : fmt::format("rank_{:05d}.{}.pt", rank, what);
}

void barrier(Parallel* par) {
  if (par && par->world_size() > 1) par->world().barrier();
}

// This rank's model, optimizer and RNG files into `tmp`, fsynced.
void write_rank_files(const fs::path& tmp, GPT& model, const dion::Optimizer& optimizer, int world, int rank) {
  {
    torch::serialize::OutputArchive ar;  // name -> this rank's part (whole for one process), CPU
    for (const auto& item : model->named_parameters()) ar.write(item.key(), item.value().detach().to(at::kCPU));
    ar.save_to((tmp / rank_file(world, rank, "model")).string());
  }
  {
    torch::serialize::OutputArchive ar;
    optimizer.save(ar);
    ar.save_to((tmp / rank_file(world, rank, "optimizer")).string());
  }
  {
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
    ar.save_to((tmp / rank_file(world, rank, "rng")).string());
  }
  for (const char* what : {"model", "optimizer", "rng"}) fsync_path(tmp / rank_file(world, rank, what));
}

}  // namespace

fs::path checkpoint_save(const fs::path& dir, GPT& model, const dion::Optimizer& optimizer, const TrainState& s,
                         const std::string& config_yaml, Parallel* par) {
  const int world = par ? par->world_size() : 1;
  const int rank = par ? par->rank() : 0;
  const bool main = rank == 0;
  fs::path tmp;
  barrier(par);  // every rank has finished the step
  if (world == 1) {
    fs::create_directories(dir);
    std::string templ = (dir / "tmp.XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw CheckpointError(fmt::format("cannot create a folder in '{}'", dir.string()));
    tmp = templ;
  } else {
    tmp = dir / ("tmp." + step_name(s.step));  // the same name on every rank (shared file system)
    if (main) {
      fs::create_directories(dir);
      remove_tree(tmp);  // the leftover of a save that was killed
      fs::create_directory(tmp);
    }
    barrier(par);
  }
  write_rank_files(tmp, model, optimizer, world, rank);
  barrier(par);  // every rank's files are on disk
  const fs::path final_dir = dir / step_name(s.step);
  if (!main) {
    barrier(par);  // rank 0 commits
    return final_dir;
  }

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
  json meta = {
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
      {"config_yaml", config_yaml},
  };
  {
    std::ofstream f(tmp / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f) throw CheckpointError(fmt::format("cannot write '{}'", (tmp / "meta.json").string()));
  }
  fsync_path(tmp / "meta.json");
  fsync_path(tmp);

  remove_tree(final_dir);  // a checkpoint of the same step (a rerun after resume)
  fs::rename(tmp, final_dir);
  fsync_path(dir);
  // Only now: remove older checkpoints and leftovers of killed writes.
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const fs::path p = entry.path();
    int64_t step = 0;
    const std::string name = p.filename().string();
    if ((is_step_dir(p, &step) && step != s.step) || name.rfind("tmp.", 0) == 0) stale.push_back(p);
  }
  for (const fs::path& p : stale) remove_tree(p);
  barrier(par);
  return final_dir;
}

std::optional<fs::path> checkpoint_find_latest(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  std::optional<fs::path> best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int64_t step = 0;
    if (is_step_dir(entry.path(), &step) && step > best_step && fs::exists(entry.path() / "meta.json")) {
      best = entry.path();
      best_step = step;
    }
  }
  return best;
}

CheckpointMeta checkpoint_read_meta(const fs::path& ckpt) {
  const fs::path file = ckpt / "meta.json";
  std::ifstream f(file);
  if (!f) throw CheckpointError(fmt::format("checkpoint '{}': no meta.json (not a dion-train checkpoint?)", ckpt.string()));
  CheckpointMeta out;
  try {
    const json meta = json::parse(f);
    if (meta.at("format") != "dion-train checkpoint" || meta.at("version") != kCheckpointVersion)
      throw CheckpointError(fmt::format("'{}': format {} version {}; this program reads 'dion-train checkpoint' "
                                        "version {}", file.string(), meta.at("format").dump(),
                                        meta.at("version").dump(), kCheckpointVersion));
    TrainState& s = out.state;
    s.step = meta.at("step");
    s.tokens = meta.at("tokens");
    s.elapsed_s = meta.at("elapsed_s");
    s.best_val_loss = meta.at("best_val_loss");
    s.best_val_step = meta.at("best_val_step");
    s.loader = {meta.at("loader").at("shard"), meta.at("loader").at("offset"), meta.at("loader").at("shard_name")};
    out.config_yaml = meta.at("config_yaml");
    const json& m = meta.at("model");
    out.model = {m.at("sequence_len"), m.at("vocab_size"), m.at("n_layer"), m.at("n_head"), m.at("n_embd")};
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed: {}", file.string(), e.what()));
  }
  return out;
}

fs::path checkpoint_resolve(const fs::path& path) {
  if (fs::exists(path / "meta.json")) return path;
  auto latest = checkpoint_find_latest(path);
  if (!latest)
    throw CheckpointError(
        fmt::format("--checkpoint '{}': neither a checkpoint (no meta.json) nor a folder holding one", path.string()));
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

void checkpoint_load_model(const fs::path& ckpt, GPT& model, const Parallel* par) {
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
      const fs::path file = ckpt / rank_file(saved.world, r, "model");
      parts.push_back({file, open_archive(file), int(f), int(t)});
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

void checkpoint_load_training(const fs::path& ckpt, dion::Optimizer& optimizer) {
  const SavedLayout saved = read_layout(ckpt);
  {
    std::vector<torch::serialize::InputArchive> archives;
    for (int r = 0; r < saved.world; ++r) archives.push_back(open_archive(ckpt / rank_file(saved.world, r, "optimizer")));
    try {
      if (archives.size() == 1) optimizer.load(archives[0]);
      else optimizer.load(archives);
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("'{}': the optimizer state does not fit this run (same optimizer and "
                                        "model?): {}", (ckpt / rank_file(saved.world, 0, "optimizer")).string(), e.what()));
    }
  }
  const fs::path rng_file = ckpt / rank_file(saved.world, 0, "rng");  // rank 0's: the run's generator
  torch::serialize::InputArchive ar = open_archive(rng_file);
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

}  // namespace dion::train
