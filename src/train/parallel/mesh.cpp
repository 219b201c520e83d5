// src/train/parallel/mesh.cpp — the mesh, placing and sharding the model, and the optimizer's
// Distribution (parallel.h). The plan by parameter name is src/train/parallel_plan.cpp; FSDP's
// gathers and reduce-scatters fsdp.cpp; TP's functions tp.cpp; DDP's buckets ddp.cpp.
#include "dion/train/parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

#include "dion/optim/distributed.h"
#include "dion/train/config.h"
#include "detail.h"

namespace dion::train {

Parallel::Parallel(comm::Group world, MeshShape shape) : world_(std::move(world)), shape_(shape) {
  if (shape_.world() != world_.size())
    throw ConfigError(
        fmt::format("dp_size {} x fs_size {} x tp_size {} = {}, but WORLD_SIZE is {}: the product of "
                    "the mesh sizes must equal the number of processes",
                    shape_.dp, shape_.fs, shape_.tp, shape_.world(), world_.size()));
  mesh_ = std::make_unique<comm::DeviceMesh>(
      world_,
      std::vector<std::pair<std::string, int>>{{"dp", int(shape_.dp)}, {"fs", int(shape_.fs)}, {"tp", int(shape_.tp)}});
  dp_ = mesh_->axis("dp");
  fs_ = mesh_->axis("fs");
  tp_ = mesh_->axis("tp");
  data_ = mesh_->flatten({"dp", "fs"});
  if (shape_.ep > 1) {
    // config_validate has refused the rest; a logic error here means a caller skipped it.
    if ((shape_.dp * shape_.fs) % shape_.ep != 0) throw std::logic_error("parallel layout: ep must divide dp x fs");
    const int ep = int(shape_.ep), efs = int(shape_.efs()), tp = int(shape_.tp);
    if (efs == 1) {
      // rank = (b * ep + e) * tp + t = data rank * tp + t, as the (dp, fs, tp) mesh.
      ep_mesh_ = std::make_unique<comm::DeviceMesh>(
          world_, std::vector<std::pair<std::string, int>>{
                      {"edp", int(shape_.dp * shape_.fs / shape_.ep)}, {"ep", ep}, {"tp", tp}});
      ep_ = ep_mesh_->axis("ep");
      edp_ = ep_mesh_->axis("edp");
    } else {
      // EP x FSDP: rank = ((d * efs + b) * ep + e) * tp + t, fs rank f = b * ep + e.
      ep_mesh_ = std::make_unique<comm::DeviceMesh>(
          world_, std::vector<std::pair<std::string, int>>{
                      {"dp", int(shape_.dp)}, {"efs", efs}, {"ep", ep}, {"tp", tp}});
      ep_ = ep_mesh_->axis("ep");
      edp_ = ep_mesh_->axis("dp");  // the replicas of this rank's expert shard
      efs_ = ep_mesh_->axis("efs");
      // The stack's group, e-major: member e * efs + b holds chunk e * efs + b of dim 0, which is
      // chunk b of ep rank e's experts. Every rank creates every such group, in the same order.
      for (int d = 0; d < int(shape_.dp); ++d)
        for (int t = 0; t < tp; ++t) {
          std::vector<int> ranks;
          for (int e = 0; e < ep; ++e)
            for (int b = 0; b < efs; ++b) ranks.push_back(((d * efs + b) * ep + e) * tp + t);
          auto g = world_.subgroup(ranks, fmt::format("experts@{}.{}", d, t));
          if (g) eshard_ = std::move(g);
        }
    }
  }
}

std::vector<at::Tensor> Parallel::expert_params(GPT& model) const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters())
    if (placement(p).ep_dim >= 0) out.push_back(p);
  return out;
}

std::vector<at::Tensor> Parallel::dense_params(GPT& model) const {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model->parameters())
    if (placement(p).ep_dim < 0) out.push_back(p);
  return out;
}

int Parallel::data_rank() const { return int(mesh_->coordinate("dp") * shape_.fs + mesh_->coordinate("fs")); }

void Parallel::place(GPT& model) {
  placements_.clear();
  ordered_.clear();
  for (auto& item : model->named_parameters()) {
    const at::Tensor& p = item.value();
    ParamPlacement pl = placement_of(item.key(), p.sizes().vec(), shape_);
    if (pl.tp_dim >= 0 && !pl.tp_gather && p.size(pl.tp_dim) % shape_.tp != 0)
      throw ConfigError(fmt::format("parameter '{}' has {} along dim {}, not divisible by tp_size {}", item.key(),
                                    p.size(pl.tp_dim), pl.tp_dim, shape_.tp));
    placements_[p.unsafeGetTensorImpl()] = pl;
    ordered_.push_back(pl);
  }
}

void Parallel::shard_model(GPT& model) {
  at::NoGradGuard no_grad;
  place(model);
  if (shape_.world() == 1) return;
  for (auto& item : model->named_parameters()) {
    at::Tensor& p = item.value();
    // A copy, so that the whole tensor is freed.
    p.set_data(local_part(p, placement(p), fs_->size(), fs_->rank(), tp_->size(), tp_->rank(), int(shape_.ep),
                          ep_rank()).clone());
  }
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

void Parallel::init_model(GPT& model) {
  place(model);
  std::unordered_map<std::string, const ParamPlacement*> by_name;
  for (const ParamPlacement& pl : ordered_) by_name[pl.name] = &pl;
  if (shape_.world() == 1) {
    model->init_weights();
    return;
  }
  model->init_weights([&](const std::string& name, const at::Tensor& full) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw std::logic_error("parallel layout: init_weights drew an unknown parameter '" + name + "'");
    return local_part(full, *it->second, fs_->size(), fs_->rank(), tp_->size(), tp_->rank(), int(shape_.ep), ep_rank()).clone();
  });
  model->set_parallel(std::shared_ptr<ModelParallel>(this, [](ModelParallel*) {}));
}

const ParamPlacement& Parallel::placement(const at::Tensor& param) const {
  auto it = placements_.find(param.unsafeGetTensorImpl());
  if (it == placements_.end()) throw std::logic_error("parallel layout: a parameter that shard_model did not place");
  return it->second;
}

std::shared_ptr<Distribution> Parallel::distribution(GPT& model, bool optimizer_syncs_gradients) const {
  if (shape_.world() == 1) return nullptr;
  std::shared_ptr<dion::Distributed> d;
  if (shape_.tp > 1) {
    d = std::make_shared<dion::Distributed>(fs_, tp_);
  } else if (shape_.fs > 1) {
    d = std::make_shared<dion::Distributed>(fs_);
  } else {
    d = std::make_shared<dion::Distributed>(dp_, optimizer_syncs_gradients);  // DDP
  }
  if (shape_.dp > 1 && (shape_.fs > 1 || shape_.tp > 1)) d->replicate(dp_, optimizer_syncs_gradients);
  // Expert stacks: split over ep, or over ep x efs (EP x FSDP); whole experts either way.
  const auto ep_axis = eshard_ ? std::make_shared<dion::GroupAxis>(eshard_)
                       : ep_   ? std::make_shared<dion::GroupAxis>(ep_)
                               : nullptr;
  for (auto& item : model->named_parameters()) {
    const ParamPlacement& pl = placement(item.value());
    if (pl.ep_dim >= 0) {  // an expert stack: this rank's experts, orthogonalized where they are
      d->shard_over(ep_axis, item.value(), pl.global_shape, pl.ep_dim);
    } else if (shape_.fs == 1 && shape_.tp == 1) {
      continue;  // DDP: replicated over dp
    } else if (shape_.tp > 1) {
      // 2-D: outer (fs) dim = the one tp does not split, even when fs is 1.
      d->shard(item.value(), pl.global_shape, pl.tp_dim == 0 ? 1 : 0, pl.tp_dim);
    } else {
      d->shard(item.value(), pl.global_shape, pl.fs_dim);
    }
  }
  return d;
}

int64_t Parallel::bytes_sent() const {
  return world_.stats().total_bytes();  // one ledger per process: every sub-group counts into the world's
}

}  // namespace dion::train
