// src/train/parallel/parallel.cpp — placing and sharding the model, computing with its shards,
// and the optimizer's Distribution (parallel.h). The groups are mesh.cpp's; FSDP fsdp.cpp; TP's
// regions tp.cpp; EP's exchanges ep.cpp.
#include "dion/train/parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

#include "dion/optim/distributed.h"
#include "dion/train/config.h"
#include "detail.h"

namespace dion::train {

Parallel::Parallel(comm::Group world, MeshShape shape) : mesh_(std::move(world), shape), fsdp_(mesh_, placements_) {}

void Parallel::place(GPT& model) {
  placements_.clear();
  const int64_t tp = mesh_.shape().tp;
  for (auto& item : model->named_parameters()) {
    const at::Tensor& p = item.value();
    Placement pl = mesh_.layout().place(item.key(), p.sizes().vec());
    if (pl.tp_dim >= 0 && !pl.tp_gather && p.size(pl.tp_dim) % tp != 0)
      throw ConfigError(fmt::format("parameter '{}' has {} along dim {}, not divisible by tp_size {}", item.key(),
                                    p.size(pl.tp_dim), pl.tp_dim, tp));
    placements_.add(p, std::move(pl));
  }
}

void Parallel::shard_model(GPT& model) {
  at::NoGradGuard no_grad;
  place(model);
  if (mesh_.world_size() == 1) return;
  for (auto& item : model->named_parameters()) {
    at::Tensor& p = item.value();
    // A copy, so that the whole tensor is freed.
    p.set_data(mesh_.layout().part(p, placement(p), mesh_.rank()).clone());
  }
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

void Parallel::init_model(GPT& model) {
  place(model);
  if (mesh_.world_size() == 1) {
    model->init_weights();
    return;
  }
  std::unordered_map<std::string, const Placement*> by_name;
  for (const Placement& pl : placements_.ordered()) by_name[pl.name] = &pl;
  model->init_weights([&](const std::string& name, const at::Tensor& full) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw std::logic_error("parallel layout: init_weights drew an unknown parameter '" + name + "'");
    return mesh_.layout().part(full, *it->second, mesh_.rank()).clone();
  });
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

std::vector<at::Tensor> Parallel::replicated_over(GPT& model, ReplicaAxis axis) const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters())
    if (mesh_.layout().replica_axis(placement(p)) == axis) out.push_back(p);
  return out;
}

at::Tensor Parallel::weight(const at::Tensor& param) {
  const Placement& pl = placement(param);
  at::Tensor w = fsdp_.gathered(pl) ? fsdp_.weight(param, pl) : param;
  if (pl.tp_gather && tp_size() > 1) w = detail::tp_gathered(*mesh_.group(Axis::tp), w, pl);
  return w;
}

at::Tensor Parallel::linear(const at::Tensor& x, const at::Tensor& param) {
  at::Tensor y = fsdp_.resharded_linear(x, param, placement(param), kernels);
  return y.defined() ? y : ModelParallel::linear(x, param);
}

std::shared_ptr<Distribution> Parallel::distribution(GPT& model, bool optimizer_syncs_gradients) const {
  const MeshShape& m = mesh_.shape();
  if (m.world() == 1) return nullptr;
  const auto& fs = mesh_.group(Axis::fs);
  const auto& tp = mesh_.group(Axis::tp);
  const auto& dp = mesh_.group(Axis::dp);
  std::shared_ptr<dion::Distributed> d;
  if (m.tp > 1) {
    d = std::make_shared<dion::Distributed>(fs, tp);
  } else if (m.fs > 1) {
    d = std::make_shared<dion::Distributed>(fs);
  } else {
    d = std::make_shared<dion::Distributed>(dp, optimizer_syncs_gradients);  // DDP
  }
  if (m.dp > 1 && (m.fs > 1 || m.tp > 1)) d->replicate(dp, optimizer_syncs_gradients);
  // Expert stacks: split over ep, or over ep x efs (EP x FSDP); whole experts either way.
  const auto& experts = mesh_.group(Axis::experts) ? mesh_.group(Axis::experts) : mesh_.group(Axis::ep);
  const auto ep_axis = experts ? std::make_shared<dion::GroupAxis>(experts) : nullptr;
  for (auto& item : model->named_parameters()) {
    const Placement& pl = placement(item.value());
    if (pl.ep_dim >= 0) {  // an expert stack: this rank's experts, orthogonalized where they are
      d->shard_over(ep_axis, item.value(), pl.global_shape, pl.ep_dim);
    } else if (m.fs == 1 && m.tp == 1) {
      continue;  // DDP: replicated over dp
    } else if (m.tp > 1) {
      // 2-D: outer (fs) dim = the one tp does not split, even when fs is 1.
      d->shard(item.value(), pl.global_shape, pl.tp_dim == 0 ? 1 : 0, pl.tp_dim);
    } else {
      d->shard(item.value(), pl.global_shape, pl.fs_dim);
    }
  }
  return d;
}

}  // namespace dion::train
