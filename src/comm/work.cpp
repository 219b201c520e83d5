// Waiting for an issued collective (see include/dion/comm/work.h).
//
// Not here: issuing collectives (group.cpp), scheduling tasks (tasks.cpp).
#include <sstream>

#include "dion/comm/tasks.h"
#include "dion/errors.h"
#include "work_state.h"

namespace dion::comm {

void throw_comm_error(const std::string& kind, const std::string& group, int rank, int size,
                      std::chrono::milliseconds timeout, const std::exception& cause) {
  std::ostringstream os;
  os << kind << " on group '" << group << "' (rank " << rank << " of " << size << ") failed; timeout "
     << timeout.count() << " ms. A peer may have died. Cause: " << dion::message_of(cause);
  throw CommError(os.str());
}

Work Work::done(at::Tensor result) {
  auto s = std::make_shared<State>();
  s->result = std::move(result);
  s->waited = true;
  return Work(std::move(s));
}

bool Work::waited() const { return !state_ || state_->waited; }

at::Tensor Work::wait() {
  if (!state_) return {};
  State& s = *state_;
  if (!s.waited) {
    // Let the other tasks in flight run first (unconditionally: see work.h).
    yield();
  }
  if (!s.waited) {  // another copy of this Work may have been waited meanwhile
    s.waited = true;
    c10::intrusive_ptr<c10d::Work> work = std::move(s.work);
    try {
      work->wait(s.timeout);  // NCCL: blocks the host until done, because a timeout is given (work.h)
    } catch (const std::exception& e) {
      try {
        throw_comm_error(s.kind, s.group, s.rank, s.size, s.timeout, e);
      } catch (const CommError&) {
        s.error = std::current_exception();
      }
    }
  }
  if (s.error) std::rethrow_exception(s.error);
  return s.result;
}

}  // namespace dion::comm
