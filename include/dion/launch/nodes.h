// dion/launch/nodes.h — torchrun's multi-node flags and restarts for `dion-train --nproc N`.
//
//   dion-train --nnodes M --node_rank K --nproc N --master_addr HOST0 --master_port P
//              [--max_restarts R] ARGS...
// runs on each of the M nodes; node K's launcher (launch.h) starts its N ranks with
// RANK = K*N + local and WORLD_SIZE = M*N, all meeting at HOST0:P (rank 0's TCPStore, on node 0).
//
// Restarts (--max_restarts R, torchrun's): when an attempt fails (a rank exits non-zero), the
// launcher stops all its local ranks (launch.h: SIGTERM, SIGKILL after the grace) and starts them
// again, up to R times. The nodes agree without talking to each other: a failure on one node
// reaches every other node's ranks through their collectives (they fail within comm_timeout_s),
// so every launcher restarts; attempt A meets at port P + A (TORCHELASTIC_RESTART_COUNT = A), so
// a late rank of attempt A-1 can never join attempt A, and the first launcher back waits in the
// rendezvous (rendezvous_timeout_s) for the others. The trainer resumes from checkpoint_dir's
// last complete checkpoint. Not restarted: an attempt ended by a signal to the launcher, or one
// whose rank exited 2 (a configuration error: the next attempt would fail the same way).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dion/launch/launch.h"

namespace dion::launch {

struct NodeFlags {
  std::optional<int> nnodes, node_rank, master_port, max_restarts;
  std::optional<std::string> master_addr;
  std::optional<std::string> cpu_bind;  // --cpu_bind: "cores" or "none"
  bool standalone = false;              // torchrun's --standalone: one node, a free local port
  bool any() const {
    return nnodes || node_rank || master_port || max_restarts || master_addr || cpu_bind || standalone;
  }
};

// Every flag the launcher takes out of dion-train's command line (take_nproc_flag and
// take_node_flags below), with the help line `dion-train --help` prints for it.
struct LauncherFlag {
  std::string name;   // "--nnodes"
  std::string value;  // "M", or "" for a switch
  std::string help;
};
const std::vector<LauncherFlag>& launcher_flags();
// The "Launcher flags" section of `dion-train --help`.
std::string launcher_help();

// Finds and removes --nnodes, --node_rank, --master_addr, --master_port, --max_restarts, --cpu_bind
// (each as `--flag V` or `--flag=V`) and --standalone. Throws std::invalid_argument naming the flag and what is valid.
NodeFlags take_node_flags(std::vector<std::string>& argv);

// Checks the combination (node_rank < nnodes; --standalone only with one node; nnodes > 1 needs --master_addr or MASTER_ADDR; the
// ports of every attempt fit in [1, 65535]); throws std::invalid_argument naming the flag. --cpu_bind cores sets bind_cores.
void apply_node_flags(const NodeFlags& flags, LaunchOptions& options);

// Runs the attempts (see the top of this file); returns the last attempt's exit code.
int run_attempts(LaunchOptions options);

}  // namespace dion::launch
