// dion/comm/work.h — the handle of an issued collective, and the communication error type.
//
// API summary
//   dion::comm::Work w = group.all_gather_async(x);   // issued now, runs in the background
//   ... compute ...
//   at::Tensor all = w.wait();                          // [size, ..]; throws CommError
//
// wait() waits at most the group's timeout. On NCCL that makes it block the host until the
// collective has finished (c10d's WorkNCCL::wait with a timeout polls the collective's end event;
// without one it would only make the current stream wait): a host read of the result right after
// wait() (.item(), a copy to the CPU, the agreement check) sees the finished collective, and a
// collective cannot be captured in a CUDA graph (dion::CudaGraphStep refuses distributed
// optimizers). The cost is one host synchronization per waited collective. On failure (a peer died, a timeout, a backend error)
// it throws CommError naming the collective, the group, this rank and the timeout, followed by
// c10d's own message (Gloo names the peer whose connection failed). A Work is waited at most
// once; later wait() calls return the same result.
//
// Inside a cooperative task (dion/comm/tasks.h), wait() first yields once to the other tasks in
// flight, so that their computation overlaps this collective. The yield is unconditional (never
// "only if not finished yet"): the order in which tasks issue collectives must not depend on
// timing, or ranks would issue them in different orders.
//
// Not here: the collectives themselves (group.h), the task scheduler (tasks.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace dion::comm {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Work {
 public:
  // A finished Work whose result is `result` (a collective on a group of one, or a no-op).
  Work() = default;
  static Work done(at::Tensor result);

  // Wait for the collective and return its result (the output tensor; for in-place collectives
  // the tensor given). Throws CommError. Copies of a Work share one state.
  at::Tensor wait();

  // True once wait() has returned (not "the backend has finished": that is timing-dependent).
  bool waited() const;

  struct State;  // the issued c10d Work and what to report on failure (src/comm/work_state.h)
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;  // null: nothing was issued, the result is empty
};

}  // namespace dion::comm
