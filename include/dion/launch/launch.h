// dion/launch/launch.h — a local launcher for users without torchrun (`dion-train --nproc N`,
// `dion-bench dist`); plain C++ and POSIX, no LibTorch.
//
// launch() starts N child processes of one command line with the environment torchrun sets for
// node K of M (RANK = K*N + local, LOCAL_RANK = local, WORLD_SIZE = M*N, LOCAL_WORLD_SIZE = N,
// GROUP_RANK = K, GROUP_WORLD_SIZE = M, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS; OMP_NUM_THREADS = hardware threads / N
// unless set, where torchrun sets 1), forwards each child's stdout and stderr
// line by line with a "[rank R] " prefix (one thread, poll() on the pipes), and:
//   - with `bind_cores` (--cpu_bind cores), pins local rank r to the physical cores
//     [r*C/N, (r+1)*C/N) of the C cores this process may run on (sched_getaffinity, grouped by
//     sysfs's package and core id), all their hardware threads, and makes OMP_NUM_THREADS (unless
//     set) its core count; fewer cores than ranks is refused before any child starts;
//   - when a child exits non-zero (or is killed), sends SIGTERM to the others, SIGKILL to those
//     still running after `grace`, and returns the first failure's exit code (128 + signal for
//     a child killed by a signal);
//   - SIGINT / SIGTERM / SIGHUP to the launcher are forwarded to every child (then SIGKILL after
//     `grace`), and the launcher returns 128 + that signal;
//   - a child gets PR_SET_PDEATHSIG(SIGKILL): if the launcher dies (kill -9), its children die.
// It returns once every child has exited and been reaped: no process outlives it.
//
// One attempt only: the multi-node flags and the restarts after a failure are dion/launch/nodes.h's; no
// rendezvous of its own (the ranks meet at MASTER_ADDR:MASTER_PORT, src/comm/group.cpp), and it
// knows nothing of training (the tool that links it decides what the children run).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace dion::launch {

struct LaunchOptions {
  int nproc = 1;                          // N >= 1: processes on this node
  int nnodes = 1;                         // M >= 1
  int node_rank = 0;                      // K in [0, M)
  std::string master_addr;                // "": $MASTER_ADDR, else 127.0.0.1
  int master_port = 0;                    // 0: $MASTER_PORT, else a free local port
  int restart_count = 0;                  // TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;                   // TORCHELASTIC_MAX_RESTARTS
  std::string exe = "/proc/self/exe";     // the program the children run
  std::vector<std::string> argv;          // their command line, argv[0] included
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL
  bool bind_cores = false;                // --cpu_bind cores: each local rank on its own cores
  int out_fd = 1;                         // where the children's prefixed stdout goes
  int err_fd = 2;                         // ... their stderr, and the launcher's own messages
  std::string name = "dion-train";  // the launcher's messages start with "<name> --nproc: " (node K: "<name> node K: ")
};

struct LaunchResult {
  int exit_code = 0;            // 0 when every child exited 0; see the top of this file
  std::vector<pid_t> pids;      // pid of each rank (all reaped when launch() returns)
  std::vector<int> rank_codes;  // exit code of each rank; 128 + signal when killed by one
  int first_failed_rank = -1;   // -1: none failed
  int signal = 0;               // the signal the launcher received and forwarded, 0: none
};

// Starts the children and waits for them (see the top of this file). Throws std::runtime_error
// for a bad `nproc`, environment (RANK or WORLD_SIZE already set: started by a launcher
// already; MASTER_PORT not in [1, 65535]), fewer cores than ranks with `bind_cores`, or a failed
// fork/pipe, before any child starts.
LaunchResult launch(const LaunchOptions& options);

// Finds `--nproc N` / `--nproc=N` (or torchrun's `--nproc_per_node`) in argv and removes it. Returns N, or nothing when absent.
// Throws std::invalid_argument naming --nproc when N is not an integer in [1, 1024].
std::optional<int> take_nproc_flag(std::vector<std::string>& argv);

// A sorted CPU list as ranges, as the --cpu_bind message writes it: {0, 1, 2, 3, 8, 9, 10, 11} -> "0-3,8-11".
std::string cpu_ranges(const std::vector<int>& cpus);

}  // namespace dion::launch
