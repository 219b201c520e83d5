// src/train/parallel/ep.cpp — expert parallelism's exchanges (parallel.h, gpt.h ModelParallel):
// the routed rows' all_to_all to the ranks of their experts and the counts' that sizes it,
// issued now and waited by the caller (moe.cpp), so that the experts compute on this rank's own
// rows while the others' travel. Not differentiable: moe.cpp's expert node sends the gradients
// back itself.
#include <ATen/ATen.h>

#include "dion/train/parallel.h"

namespace dion::train {

ModelParallel::Pending Parallel::ep_start(const at::Tensor& x, const std::vector<int64_t>& send,
                                          const std::vector<int64_t>& recv) {
  comm::Group* ep = mesh_.group(Axis::ep).get();
  if (!ep || ep->size() == 1) return ModelParallel::ep_start(x, send, recv);
  const at::Tensor rows = x.detach().contiguous();  // alive until the wait (held by the function)
  comm::Work work = ep->all_to_all_async(rows, send, recv);
  return [rows, work]() mutable { return work.wait(); };
}

ModelParallel::Pending Parallel::ep_start_counts(const at::Tensor& counts) {
  comm::Group* ep = mesh_.group(Axis::ep).get();
  if (!ep || ep->size() == 1) return ModelParallel::ep_start_counts(counts);
  const at::Tensor c = counts.to(ep->control_device()).contiguous();
  comm::Work work = ep->all_to_all_async(c);
  return [c, work]() mutable { return work.wait(); };
}

}  // namespace dion::train
