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

#include "dion/train/fs_util.h"
#include <cstdlib>
#include <fstream>
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

}  // namespace

fs::path checkpoint_save(const fs::path& dir, GPT& model, const dion::Optimizer& optimizer, const TrainState& s,
                         const std::string& config_yaml) {
  fs::create_directories(dir);
  std::string templ = (dir / "tmp.XXXXXX").string();
  if (!::mkdtemp(templ.data())) throw CheckpointError(fmt::format("cannot create a folder in '{}'", dir.string()));
  const fs::path tmp = templ;

  // model.pt: name -> whole tensor on CPU
  json params = json::array();
  {
    torch::serialize::OutputArchive ar;
    for (const auto& item : model->named_parameters()) {
      ar.write(item.key(), item.value().detach().to(at::kCPU));
      params.push_back({{"name", item.key()},
                        {"shape", item.value().sizes().vec()},
                        {"dtype", std::string(c10::toString(item.value().scalar_type()))}});
    }
    ar.save_to((tmp / "model.pt").string());
  }
  {
    torch::serialize::OutputArchive ar;
    optimizer.save(ar);
    ar.save_to((tmp / "optimizer.pt").string());
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
    ar.save_to((tmp / "rng.pt").string());
  }
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
      {"layout", {{"dp_size", 1}, {"fs_size", 1}, {"tp_size", 1}, {"world_size", 1},
                  {"note", "tensors are whole (global shapes); one file per checkpoint"}}},
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
  for (const char* name : {"model.pt", "optimizer.pt", "rng.pt", "meta.json"}) fsync_path(tmp / name);
  fsync_path(tmp);

  const fs::path final_dir = dir / step_name(s.step);
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

void checkpoint_load_model(const fs::path& ckpt, GPT& model) {
  const fs::path file = ckpt / "model.pt";
  torch::serialize::InputArchive ar = open_archive(file);
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    at::Tensor t;
    if (!ar.try_read(item.key(), t))
      throw CheckpointError(fmt::format("'{}': no tensor '{}' (a checkpoint of another model?)", file.string(), item.key()));
    if (t.sizes() != item.value().sizes())
      throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, the model's is {} (model_dim, n_layer, "
                                        "n_head must match the checkpoint's)",
                                        file.string(), item.key(), shape_text(t.sizes()),
                                        shape_text(item.value().sizes())));
    item.value().copy_(t);
  }
}

void checkpoint_load_training(const fs::path& ckpt, dion::Optimizer& optimizer) {
  {
    torch::serialize::InputArchive ar = open_archive(ckpt / "optimizer.pt");
    try {
      optimizer.load(ar);
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("'{}': the optimizer state does not fit this run (same optimizer and "
                                        "model?): {}", (ckpt / "optimizer.pt").string(), e.what()));
    }
  }
  torch::serialize::InputArchive ar = open_archive(ckpt / "rng.pt");
  at::Tensor cpu;
  if (!ar.try_read("cpu", cpu)) throw CheckpointError(fmt::format("'{}': no 'cpu' generator state", (ckpt / "rng.pt").string()));
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
