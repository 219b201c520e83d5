// dion/comm/tasks.h — up to K tasks in flight on ONE thread, switching at their collectives.
//
// API summary
//   std::vector<dion::comm::Task> tasks = {{[&] { step_batch(0); }}, {[&] { step_batch(1); }}};
//   dion::comm::run_tasks(tasks, /*max_in_flight=*/3);
//   // inside a task, Work::wait() (and so every blocking collective) yields to the others
//
// The reference's AsyncRuntime (dion/opt_utils.py): each task is a generator that yields after
// issuing a collective; the runtime keeps up to K of them in flight and resumes them in a fixed
// order, so one task's communication overlaps the others' computation. Here a task is a plain
// function running on a stack of its own (a stackful coroutine, ucontext): it reaches a yield
// wherever a Work is waited, however deep in the call stack (a reduction callback inside the
// math, say), so the algorithm code stays straight-line C++.
//
// Schedule (the reference's run loop, deterministic): each round starts the next task if fewer
// than K are in flight (it runs to its first yield), then resumes every task of the previous
// round once, in that round's order (the newest first, as the reference's list). No decision
// depends on timing, so every rank issues the same collectives in the same order on one group.
//
// Guarantees:
//   - one OS thread: no thread is started, the caller's thread-local state (grad mode, the
//     torch generators) is what every task sees;
//   - a task marked `serial` starts only after the previous serial task finished (tasks that
//     draw random numbers keep their draws in the K = 1 order);
//   - errors: once a task throws, no new task starts; the tasks in flight run to their end (their
//     collectives are already issued on every rank); then the first error, in task order, is
//     rethrown and the others are printed to stderr. Nothing is abandoned half-way.
//   - K = 1, or a call from inside a task: the tasks run one after another, inline.
// Rules for task code: do not yield (wait a Work) inside a catch block; keep stack use under
// kTaskStackBytes (8 MiB, as a thread's default).
//
// Not here: what a task computes (the optimizer), the collectives (group.h).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace dion::comm {

struct Task {
  std::function<void()> run;
  bool serial = false;  // start only after the previous serial task has finished
};

inline constexpr std::size_t kTaskStackBytes = std::size_t{8} << 20;

// Run `tasks` to completion with up to `max_in_flight` of them in flight (see above).
void run_tasks(std::vector<Task>& tasks, int max_in_flight);

// Inside a task run by run_tasks: let the other tasks in flight run one round, then continue.
// Elsewhere: returns at once.
void yield();

// Whether the caller runs inside a task of run_tasks.
bool in_task();

}  // namespace dion::comm
