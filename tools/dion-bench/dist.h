// tools/dion-bench/dist.h — `dion-bench dist`: the distributed optimizer step at 1, 2, 4 ...
// ranks (Gloo over loopback), time and bytes per step per rank, and the rates the cost model
// (scripts/cost_model.py) is calibrated with, all in one run.
//
// For each world size W in `ranks`: W = 1 runs in this process (the plain optimizer, no
// Distribution: "the same step in one process"); W > 1 starts W copies of this program with
// torchrun's variables (the launcher library, dion/launch/launch.h),
// each a rank running run_dist_rank(); rank 0 writes its results to a file this process reads.
// Every rank builds the same parameter set's block matrices (gpt_params.h) and gradients from one
// seed, and for each layout x variant an optimizer over them:
//   fsdp: every matrix sharded along dim 0 (FSDP2 chunks) over the world, dion::Distributed;
//   ddp:  every rank holds every matrix; Muon / Dion2 split each megabatch over the ranks and
//         all_gather (gradients taken as already synchronized); legacy Dion syncs over the
//         replicas itself (sync_gradients: the gradient at rank fraction 1, else only P and R).
// Per variant: one first step, then the bytes one steady step passes to each collective kind
// (comm::CommStats, every rank), then `reps` timed steps, interleaved across the variants (round
// r in order, r + 1 reversed) with a barrier before each: wall time per step = the slowest rank's,
// and rank 0's process CPU time. Then, with every rank busy at once as in a step: the bf16 and
// fp32 matmul rate per rank, and plain all_to_all / all_reduce / all_gather of a small and a large
// payload (the cost model's link latency and bandwidth).
//
// What it is not: a cluster measurement. W ranks on this machine's shared cores measure the
// algorithm's communication and its overlap with compute through loopback; W > cores time-slice.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dion::bench {

struct DistVariant {
  std::string name;         // as given: "muon", "dion2@0.25", "dion@1/16"
  std::string algorithm;    // a registered matrix algorithm (its name, not an alias)
  std::string size_option;  // its bench_entry's size_option (algorithms.h; "": whole matrices)
  double size = 1.0;        // that hyperparameter's value (the F of ALGORITHM@F)
};

// "ALGORITHM" for one that orthogonalizes whole matrices (muon), "ALGORITHM@F" for one with a
// size_option (dion2@0.25, dion@1/16; F a decimal or a/b in (0, 1]); throws
// std::invalid_argument naming what is valid.
DistVariant parse_dist_variant(const std::string& text);

struct DistArgs {
  std::vector<int> ranks;       // world sizes, e.g. {1, 2, 4}
  int64_t d = 256, layers = 4;  // the parameter set
  std::vector<DistVariant> variants;
  std::vector<std::string> layouts;  // fsdp, ddp
  int reps = 5;
  int threads = 1;                          // intra-op threads per rank
  std::vector<std::string> argv_for_ranks;  // this program's command line for the ranks
};

// The whole table (all world sizes), with the machine description; throws on a failed rank.
nlohmann::json run_dist(const DistArgs& args);

// One rank of a W > 1 run (the program was started by run_dist with `--rank-result FILE`):
// measures, and rank 0 writes its JSON to `result_path`. Returns the exit code.
int run_dist_rank(const DistArgs& args, const std::string& result_path);

}  // namespace dion::bench
