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
  std::map<std::string, Placement> params;
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
      Placement pl{p.at("name"), p.at("shape").get<std::vector<int64_t>>()};
      for (const SplitField& f : split_fields()) pl.*f.field = p.value(f.key, f.unsplit);
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
  const Layout layout(saved.mesh);
  // The saved rank files, opened when first needed: each tensor is read from the ranks that
  // counted it at the saved layout (layout.h: their parts tile it once).
  std::map<int, torch::serialize::InputArchive> archives;
  auto archive = [&](int r) -> torch::serialize::InputArchive& {
    auto it = archives.find(r);
    if (it == archives.end()) it = archives.emplace(r, open_archive(ckpt, rank_file(saved.world, r, "model"))).first;
    return it->second;
  };
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    auto it = saved.params.find(name);
    if (it == saved.params.end())
      throw CheckpointError(fmt::format("'{}': no parameter '{}' in meta.json (a checkpoint of another model?)",
                                        (ckpt / "meta.json").string(), name));
    const Placement& sp = it->second;
    const std::vector<int64_t> want = par ? par->placement(item.value()).global_shape : item.value().sizes().vec();
    if (sp.global_shape != want)
      throw CheckpointError(
          fmt::format("'{}': tensor '{}' has shape {}, the model's is {} (model_dim, n_layer, "
                      "n_head must match the checkpoint's)",
                      (ckpt / "meta.json").string(), name, shape_text(sp.global_shape), shape_text(want)));
    // Reassemble the whole tensor from the saved parts, then cut this rank's part.
    at::Tensor full;
    const std::vector<int> owners = layout.owners(sp);
    for (int r : owners) {
      const fs::path file = ckpt / rank_file(saved.world, r, "model");
      at::Tensor t;
      if (!archive(r).try_read(name, t))
        throw CheckpointError(fmt::format("'{}': no tensor '{}' (a checkpoint of another model?)", file.string(), name));
      const Box box = layout.box(sp, r);
      if (t.sizes().vec() != box.length)
        throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, its place in the layout says {}",
                                          file.string(), name, shape_text(t.sizes()), shape_text(box.length)));
      if (owners.size() == 1) {
        full = t;
        break;
      }
      if (!full.defined()) full = at::empty(sp.global_shape, t.options());
      at::Tensor dst = full;
      for (size_t d = 0; d < box.start.size(); ++d) dst = dst.narrow(int64_t(d), box.start[d], box.length[d]);
      dst.copy_(t);
    }
    const bool parts = par && par->mesh().world_size() > 1;
    item.value().copy_(parts ? par->mesh().layout().part(full, par->placement(item.value()), par->mesh().rank()) : full);
  }
  for (auto& item : model->named_buffers()) {  // whole on every rank: rank 0's
    at::Tensor t;
    if (!archive(0).try_read(item.key(), t))
      throw CheckpointError(fmt::format("'{}': no buffer '{}' (a checkpoint of another model?)",
                                        (ckpt / rank_file(saved.world, 0, "model")).string(), item.key()));
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
