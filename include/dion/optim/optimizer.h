// dion/optim/optimizer.h — the optimizer classes.
//
// API summary
// -----------
//   dion::Optimizer opt(groups, defaults, ortho);   // any mix of algorithms, one per group
//   dion::NamedOptimizer<"name">-style classes (dion/dion.h: one per registered matrix
//       algorithm, the reference's class names): their own algorithm for matrix groups, plus
//       scalar groups for the other parameters; defaults are the reference's defaults.
//   opt.step();                        // NoGradGuard inside; params without .grad() are skipped
//   opt.zero_grad();                   // from torch::optim::Optimizer
//   torch::save(opt, "opt.pt"); torch::load(opt, "opt.pt");   // state + group options
//   torch::optim::StepLR sched(opt, 10, 0.5);                  // LibTorch schedulers set lr
//   opt.init_state();                  // create every parameter's state now (rank-symmetric
//                                      // checkpoints; the reference does this eagerly)
//
// Groups:
//   std::vector<dion::ParamGroup> groups = {
//       {block_matrices},                                          // the defaults ("muon")
//       {qkv_weights, {.split_sizes = std::vector<int64_t>{512, 128, 128}}},  // muon, normuon
//       {embeddings_and_norms, {.algorithm = "adamw", .lr = 3e-3}},
//       {{lm_head}, {.algorithm = "lion", .lr = 3e-3 / std::sqrt(768.0)}},  // the Dion paper's scale
//   };
//   dion::Optimizer opt(groups, dion::Options(0.02).algorithm("muon"));
//   opt.set_distribution(dist);        // DDP / FSDP / TP: dion/optim/distributed.h (or pass it
//                                      // as the constructor's last argument)
//
// What happens in step(), per matrix group: parameters with a gradient are bucketed by
// (shape, dtype) in order of first appearance ("megabatches"); each megabatch runs the
// algorithm's update (its spec's, dion/optim/algorithm.h: for the orthonormal family a pre
// step on every member, ONE stacked orthogonalization, and the post step; dion/math/*.h).
// Scalar groups run one multi-tensor update per group. Invalid hyperparameters or
// shapes throw dion::ValueError / NotImplementedError at construction (or in add_param_group),
// naming the group index, the option and the value.
//
// Shapes: parameters [m, n]; 3-D+ are batches of matrices, or [dim0, prod(rest)] with flatten.
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dion/errors.h"
#include "dion/math/normuon.h"
#include "dion/math/ortho.h"
#include "dion/optim/distribution.h"
#include "dion/optim/options.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace dion {

// Parameters plus the fields of the optimizer's defaults this group changes.
struct ParamGroup {
  std::vector<at::Tensor> params;
  Override options = {};
};

class Optimizer : public torch::optim::Optimizer {
 public:
  // `distribution`: where the parameters live (dion/optim/distribution.h), if not all whole and
  // local. Given here, the shape checks (num_heads, split_sizes) see global shapes; it can also
  // be set later with set_distribution().
  Optimizer(const std::vector<ParamGroup>& groups, const Options& defaults, math::OrthoConfig ortho = {},
            std::shared_ptr<Distribution> distribution = nullptr);
  Optimizer(std::vector<at::Tensor> params, const Options& defaults, math::OrthoConfig ortho = {},
            std::shared_ptr<Distribution> distribution = nullptr);

  at::Tensor step(LossClosure closure = nullptr) override;
  // Checkpoints know their layout (docs/optimizers.md, "Checkpoints"): save() writes each state
  // tensor with its global shape and this rank's offsets; load() cuts this rank's state out of
  // the saved slices, so a state saved at one layout (world size, FSDP / TP split) loads at
  // another. Pass the archives of every rank that saved (any order; one archive is enough when
  // it covers this rank's slices: a single process, or replicated state). All or nothing: a
  // refused load (shape, dtype, algorithm or group mismatch, missing slices) throws
  // dion::ValueError naming the parameter and leaves the optimizer exactly as it was.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  void load(std::vector<torch::serialize::InputArchive>& archives);

  // Add a group after construction (validated like the others).
  void add_param_group(const ParamGroup& group);

  // Create the state of every parameter of every group now (the reference's pre-population).
  void init_state();

  // With optimizer-side gradient sync, legacy Dion's momenta drift apart across replicas
  // (decoupled momentum); average every state tensor over the replicas before saving a
  // checkpoint. A no-op without a Distribution that syncs gradients.
  void synchronize_for_checkpoint();

  Options& options(size_t group);
  const Options& options(size_t group) const;
  // Replace group g's options (a Python group edit, a loaded checkpoint's group), validated and
  // checked against the group's parameters as add_param_group does; a refused change leaves
  // everything as it was. A new algorithm drops the state of the group's parameters (the next
  // step or init_state creates the new algorithm's state). check_options: the checks alone.
  void set_options(size_t group, const Options& options);
  void check_options(size_t group, const Options& options) const;
  ParamState* state_of(const at::Tensor& param);  // nullptr before the first step / init_state

  // The state tensors `param` has in a group with options `o`: {key, shape (this rank's), dtype,
  // layout} for each, in creation order: the algorithm's table (AlgorithmSpec::state). The step
  // creates state from it, checkpoints record each tensor's layout from it, and a load (the
  // Python module's load_state_dict) checks a checkpoint against it.
  using StateSpec = ::dion::StateSpec;  // dion/optim/algorithm.h
  std::vector<StateSpec> state_specs(const at::Tensor& param, const Options& o) const;

  // Device scalars: each group's lr and weight decay read from 0-d float32 tensors on its
  // parameters' device (dion/math/rates.h) instead of host values — what a captured CUDA graph
  // needs to follow an lr schedule (CudaGraphStep turns this on). step() fills the tensors from
  // the groups' Options first, in place (the same tensors for the optimizer's lifetime), except
  // while the current CUDA stream is capturing: refresh_device_scalars() before capturing or
  // replaying a graph (CudaGraphStep does). Off by default. Results equal the host values' (on
  // CPU bit for bit, tests/optim/test_optimizer.cpp DeviceScalars*). AdamW groups read lr there;
  // their weight decay stays a host value (torch's fused AdamW takes it as a double).
  void set_device_scalars(bool on);
  bool device_scalars() const { return device_scalars_on_; }
  void refresh_device_scalars();
  // Group g's tensors (undefined before the first refresh, or for a group without parameters).
  const DeviceScalars& device_scalars_of(size_t group) const;
  const math::OrthoConfig& ortho() const { return ortho_; }

  // Replicated (DDP) or sharded (FSDP) parameters: see dion/optim/distribution.h and
  // dion/optim/distributed.h. Call before the first step; nullptr = single process. The groups'
  // shape checks run again against the global shapes.
  void set_distribution(std::shared_ptr<Distribution> distribution);
  const std::shared_ptr<Distribution>& distribution() const { return dist_; }

 protected:
  // The algorithm a matrix group of this optimizer may use (nullopt: any).
 public:
  Optimizer(math::OrthoConfig ortho, const Options& defaults, std::optional<Algorithm> only_algorithm,
            std::shared_ptr<Distribution> distribution);

 protected:
  void add_group_checked(std::vector<at::Tensor> params, Options options);

 private:
  // State is created on the calling thread before the step's tasks run (they only read it).
  ParamState& state_for(const at::Tensor& param, const Options& group);
  void check_group(size_t index, const std::vector<at::Tensor>& params, const Options& group) const;
  void check_loaded_state() const;
  void load_checked(std::vector<torch::serialize::InputArchive>& roots);  // checkpoint.cpp
  void load_legacy(torch::serialize::InputArchive& archive);              // archives without layout (earlier format)

  math::OrthoConfig ortho_;
  math::OrthoFn ortho_fn_;
  std::optional<Algorithm> only_algorithm_;
  std::shared_ptr<Distribution> dist_;
  std::vector<int64_t> agreed_;  // what every rank last agreed it optimizes (src/optim/agreement.h)
  // Each parameter's shape when its group was added: step() refuses one resized since (its state
  // has the old shape).
  std::unordered_map<const c10::TensorImpl*, std::vector<int64_t>> shapes_;
  void check_shapes_unchanged() const;
  bool device_scalars_on_ = false;
  std::vector<DeviceScalars> device_scalars_;  // per group, when device_scalars_on_
};

// A class of one matrix algorithm (dion/dion.h declares the reference's: DION_OPTIMIZER_CLASS):
// groups of that algorithm plus scalar groups; defaults() is the algorithm's spec's.
class NamedOptimizer : public Optimizer {
 public:
  NamedOptimizer(const std::string& algorithm, const std::vector<ParamGroup>& groups, const Options& defaults,
                 math::OrthoConfig ortho, std::shared_ptr<Distribution> distribution);
  static Options defaults_of(const std::string& algorithm);  // throws ValueError for an unknown name
};

}  // namespace dion
