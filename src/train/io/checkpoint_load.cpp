// src/train/io/checkpoint_load.cpp — loading a checkpoint at any layout: the model's tensors
// reassembled from the saved parts and cut to this rank's, the optimizer and generator states
// (checkpoint.h).
#include "dion/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stdio.h>
#include <sys/stat.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
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
    out.mesh = {l.at("dp_size"), l.at("fs_size"), l.at("tp_size"), l.value("ep_size", int64_t(1))};
    out.world = l.at("world_size");
    if (out.world != out.mesh.world() || out.world < 1)
      throw CheckpointError(fmt::format("'{}': layout dp {} x fs {} x tp {} does not match its world size {}",
                                        file.string(), out.mesh.dp, out.mesh.fs, out.mesh.tp, out.world));
    for (const json& p : meta.at("params")) {
      ParamPlacement pl{p.at("name"), p.at("shape").get<std::vector<int64_t>>()};
      pl.fs_dim = p.value("fs_dim", int64_t(-1));
      pl.tp_dim = p.value("tp_dim", int64_t(-1));
      pl.ep_dim = p.value("ep_dim", int64_t(-1));
      pl.efs = p.value("efs", int64_t(1));
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
    int fs_rank = 0, tp_rank = 0, ep_rank = 0;
  };
  std::vector<Part> parts;
  for (int64_t f = 0; f < saved.mesh.fs; ++f)
    for (int64_t t = 0; t < saved.mesh.tp; ++t) {
      const int r = int(f * saved.mesh.tp + t);  // mesh (dp, fs, tp) at dp index 0
      const std::string name = rank_file(saved.world, r, "model");
      parts.push_back({ckpt / name, open_archive(ckpt, name), int(f), int(t)});
    }
  // An MoE expert stack split over ep: the parts of ep ranks 0..ep-1 (data ranks 0..ep-1, tp rank
  // 0); under EP x FSDP (efs > 1) over ep x efs = fs: data ranks 0..fs-1.
  std::vector<Part> ep_parts;
  const int64_t expert_parts = saved.mesh.ep > 1 ? saved.mesh.ep * saved.mesh.efs() : 0;
  for (int64_t d = 0; d < expert_parts; ++d) {
    const std::string name = rank_file(saved.world, int(d * saved.mesh.tp), "model");
    ep_parts.push_back({ckpt / name, open_archive(ckpt, name), int(d % saved.mesh.fs), 0, int(d % saved.mesh.ep)});
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
      throw CheckpointError(
          fmt::format("'{}': tensor '{}' has shape {}, the model's is {} (model_dim, n_layer, "
                      "n_head must match the checkpoint's)",
                      (ckpt / "meta.json").string(), name, shape_text(sp.global_shape), shape_text(want)));
    // Reassemble the whole tensor from the saved parts, then cut this rank's part.
    at::Tensor full;
    const bool by_ep = sp.ep_dim >= 0;
    for (Part& part : by_ep ? ep_parts : parts) {
      at::Tensor t;
      if (!part.archive.try_read(name, t))
        throw CheckpointError(
            fmt::format("'{}': no tensor '{}' (a checkpoint of another model?)", part.file.string(), name));
      const Box box = by_ep ? local_box(sp, int(saved.mesh.fs), part.fs_rank, 1, 0, int(saved.mesh.ep), part.ep_rank)
                            : local_box(sp, int(saved.mesh.fs), part.fs_rank, int(saved.mesh.tp), part.tp_rank);
      if (t.sizes().vec() != box.length)
        throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, its place in the layout says {}",
                                          part.file.string(), name, shape_text(t.sizes()), shape_text(box.length)));
      if (!by_ep && parts.size() == 1) {
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
      mine = local_part(full, pl, par->fs_group()->size(), par->fs_rank(), int(par->shape().tp), par->tp_rank(),
                        int(par->shape().ep), int(par->ep_rank()));
    }
    item.value().copy_(mine);
  }
  for (auto& item : model->named_buffers()) {  // whole on every rank: rank 0's
    at::Tensor t;
    if (!parts[0].archive.try_read(item.key(), t))
      throw CheckpointError(fmt::format("'{}': no buffer '{}' (a checkpoint of another model?)",
                                        parts[0].file.string(), item.key()));
    item.value().copy_(t);
  }
}

void load_training(const fs::path& ckpt, dion::Optimizer& optimizer) {
  const SavedLayout saved = read_layout(ckpt);
  {
    std::vector<torch::serialize::InputArchive> archives;
    for (int r = 0; r < saved.world; ++r)
      archives.push_back(open_archive(ckpt, rank_file(saved.world, r, "optimizer")));
    try {
      if (archives.size() == 1)
        optimizer.load(archives[0]);
      else
        optimizer.load(archives);
    } catch (const std::exception& e) {
      throw CheckpointError(
          fmt::format("'{}': the optimizer state does not fit this run (same optimizer and "
                      "model?): {}",
                      (ckpt / rank_file(saved.world, 0, "optimizer")).string(), error_text(e)));
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
