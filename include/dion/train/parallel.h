// dion/train/parallel.h — the model-parallel runtime of a training run: the mesh (mesh.h), the
// placement of every parameter (layout.h), and the model computing with its shards (FSDP's
// gathers in fsdp.h, TP's regions and EP's exchanges here). The reference's train.py
// init_distributed + models/gpt_model.py parallelize_gpt_model, over dion_comm groups.
//
//   Parallel par(world, {dp, fs, tp, ep});  // collective: builds the mesh; dp*fs*tp == world size
//   par.init_model(model);                  // draws the weights one at a time, keeping this rank's parts
//   par.placement(p), par.box(p)            // where `p` lives; this rank's part of it
//   auto dist = par.distribution(model, sync);  // the optimizer's Distribution (null for one process)
//
// Collectives run on the thread that calls forward / backward, in graph order, the same on every
// rank. The trainer divides each micro-batch loss by the global micro-batch count, so every
// reduction is a plain sum (docs/train.md "Parallel layouts").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dion/optim/distribution.h"
#include "dion/train/fsdp.h"
#include "dion/train/gpt.h"
#include "dion/train/layout.h"
#include "dion/train/mesh.h"

namespace dion::train {

class Parallel : public ModelParallel {
 public:
  // Collective over `world`. Throws ConfigError (on every rank) when dp*fs*tp != world size.
  Parallel(comm::Group world, MeshShape shape);

  Mesh& mesh() { return mesh_; }
  const Mesh& mesh() const { return mesh_; }
  Fsdp& fsdp() { return fsdp_; }

  // Replace every parameter of `model` (whole, identical on every rank) by this rank's part
  // (Tensor::set_data: names and identities stay) and make the model compute through this.
  void shard_model(GPT& model);
  // The same end state from a model built with GPTConfig::placeholder_weights, under the seed:
  // each weight drawn whole and cut to this rank's part before the next is drawn.
  void init_model(GPT& model);
  const Placement& placement(const at::Tensor& param) const { return placements_.of(param); }
  Box box(const at::Tensor& param) const { return mesh_.layout().box(placement(param), mesh_.rank()); }
  // The parameters whose replicas live over `axis` (dp: the dense ones; edp: the expert stacks).
  std::vector<at::Tensor> replicated_over(GPT& model, ReplicaAxis axis) const;

  // The optimizer's Distribution for this layout (null for one process), every parameter
  // registered. `optimizer_syncs_gradients`: legacy Dion's replicate_mesh_grad_sync.
  std::shared_ptr<Distribution> distribution(GPT& model, bool optimizer_syncs_gradients) const;

  // ModelParallel
  at::Tensor weight(const at::Tensor& param) override;
  at::Tensor linear(const at::Tensor& x, const at::Tensor& param) override;
  at::Tensor tp_enter(const at::Tensor& x) override;
  at::Tensor tp_exit(const at::Tensor& x) override;
  int64_t tp_size() const override { return mesh_.shape().tp; }
  int64_t ep_size() const override { return mesh_.shape().ep; }
  int64_t ep_rank() const override { return mesh_.coord().ep; }
  Pending ep_start(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) override;
  Pending ep_start_counts(const at::Tensor& counts) override;

 private:
  void place(GPT& model);
  Mesh mesh_;
  Placements placements_;
  Fsdp fsdp_;
};

}  // namespace dion::train
