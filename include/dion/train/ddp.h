// dion/train/ddp.h — data-parallel gradient sum over a group (DDP, HSDP's dp axis, an MoE's
// experts over edp): bucketed all_reduce launched from the parameters' post-accumulate-grad hooks
// while backward runs, in bucket order on every rank.
//   GradSync sync(mesh.replicas(ReplicaAxis::dp), params, bucket_bytes);
//   sync.arm();       before the LAST micro-batch's backward (earlier ones only accumulate)
//   loss.backward();  buckets are launched as they fill, in bucket order
//   sync.finish();    launches what is left, waits every bucket, writes the sums into .grad
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dion/comm/group.h"
#include "dion/comm/work.h"

namespace dion::train {

class GradSync {
 public:
  GradSync(std::shared_ptr<comm::Group> group, std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~GradSync();
  void arm();
  void finish();
  int64_t buckets() const { return int64_t(buckets_.size()); }
  // Buckets of the last finish() whose all_reduce was launched from a hook during backward
  // (the others were launched by finish()).
  int64_t launched_during_backward() const { return launched_in_backward_; }

  void ready(size_t param_index);  // called by the hooks

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    size_t pending = 0;
    at::Tensor flat;
    comm::Work work;
    bool launched = false;
  };
  void launch_ready_prefix();
  void launch(Bucket& b);

  std::shared_ptr<comm::Group> group_;
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
  bool armed_ = false;
};

}  // namespace dion::train
