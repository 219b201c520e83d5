// Cooperative tasks on one thread (see include/dion/comm/tasks.h): ucontext fibers, each on an
// mmap'ed stack with a guard page, scheduled as the reference's AsyncRuntime.
//
// Not here: anything about collectives (Work::wait calls yield()).
#include "dion/comm/tasks.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

namespace dion::comm {

namespace {

// An mmap'ed stack: the lowest page is a guard (PROT_NONE), so an overflow faults instead of
// overwriting memory. Pages are committed as they are touched.
class Stack {
 public:
  Stack() {
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    size_ = kTaskStackBytes + page_;
    void* p =
        ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (::mprotect(p, page_, PROT_NONE) != 0) {
      ::munmap(p, size_);
      throw std::bad_alloc();
    }
    base_ = p;
  }
  ~Stack() { ::munmap(base_, size_); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  void* bottom() const { return static_cast<char*>(base_) + page_; }
  std::size_t usable() const { return size_ - page_; }

 private:
  void* base_ = nullptr;
  std::size_t size_ = 0, page_ = 0;
};

// Stacks kept for the next run on this thread (a step reuses the previous step's).
thread_local std::vector<std::unique_ptr<Stack>> t_free_stacks;

struct Fiber {
  ucontext_t context{};  // the task's
  ucontext_t resumer{};  // where yield() and the end of the task return to
  std::unique_ptr<Stack> stack;
  const Task* task = nullptr;
  std::size_t index = 0;
  std::exception_ptr error;
  bool done = false;
};

thread_local Fiber* t_current = nullptr;

void fiber_main(unsigned int hi, unsigned int lo) {
  Fiber* f = reinterpret_cast<Fiber*>((static_cast<std::uintptr_t>(hi) << 32) | static_cast<std::uintptr_t>(lo));
  try {
    f->task->run();
  } catch (...) {
    f->error = std::current_exception();
  }
  f->done = true;
  ::swapcontext(&f->context, &f->resumer);  // never resumed again
}

// Run `f` until it yields or ends.
void resume(Fiber& f) {
  Fiber* outer = t_current;
  t_current = &f;
  ::swapcontext(&f.resumer, &f.context);
  t_current = outer;
}

std::unique_ptr<Fiber> start(const Task& task, std::size_t index) {
  auto f = std::make_unique<Fiber>();
  f->task = &task;
  f->index = index;
  if (!t_free_stacks.empty()) {
    f->stack = std::move(t_free_stacks.back());
    t_free_stacks.pop_back();
  } else {
    f->stack = std::make_unique<Stack>();
  }
  if (::getcontext(&f->context) != 0) throw std::runtime_error("run_tasks: getcontext failed");
  f->context.uc_stack.ss_sp = f->stack->bottom();
  f->context.uc_stack.ss_size = f->stack->usable();
  f->context.uc_link = nullptr;
  const auto bits = reinterpret_cast<std::uintptr_t>(f.get());
  ::makecontext(&f->context, reinterpret_cast<void (*)()>(&fiber_main), 2, static_cast<unsigned int>(bits >> 32),
                static_cast<unsigned int>(bits & 0xffffffffu));
  resume(*f);
  return f;
}

void release(std::unique_ptr<Fiber>& f) {
  t_free_stacks.push_back(std::move(f->stack));
  f.reset();
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

}  // namespace

bool in_task() { return t_current != nullptr; }

void yield() {
  Fiber* f = t_current;
  if (!f) return;
  ::swapcontext(&f->context, &f->resumer);
}

void run_tasks(std::vector<Task>& tasks, int max_in_flight) {
  if (max_in_flight <= 1 || tasks.size() <= 1 || in_task()) {
    for (Task& t : tasks) t.run();
    return;
  }
  const std::size_t K = static_cast<std::size_t>(max_in_flight);
  std::vector<std::unique_ptr<Fiber>> in_flight;  // in start order
  std::vector<std::pair<std::size_t, std::exception_ptr>> errors;
  std::size_t next = 0;
  bool serial_in_flight = false;
  auto finish = [&](std::unique_ptr<Fiber>& f) {
    if (f->error) errors.emplace_back(f->index, f->error);
    if (f->task->serial) serial_in_flight = false;
    release(f);
  };
  while ((next < tasks.size() && errors.empty()) || !in_flight.empty()) {
    std::vector<std::unique_ptr<Fiber>> running;
    // Start the next task (it runs to its first yield), unless K are in flight, a task failed,
    // or it is serial and the previous serial task is still running.
    if (next < tasks.size() && errors.empty() && in_flight.size() < K && !(tasks[next].serial && serial_in_flight)) {
      if (tasks[next].serial) serial_in_flight = true;
      std::unique_ptr<Fiber> f = start(tasks[next], next);
      ++next;
      if (f->done)
        finish(f);
      else
        running.push_back(std::move(f));
    }
    // Resume every task of the previous round once, in that round's order.
    for (auto& f : in_flight) {
      resume(*f);
      if (f->done)
        finish(f);
      else
        running.push_back(std::move(f));
    }
    in_flight = std::move(running);
  }
  if (errors.empty()) return;
  std::sort(errors.begin(), errors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < errors.size(); ++i)
    std::fprintf(stderr, "[dion] task %zu of the same step also failed: %s\n", errors[i].first,
                 what_of(errors[i].second).c_str());
  std::rethrow_exception(errors.front().second);
}

}  // namespace dion::comm
