// agreement.h — the check that every rank holds the same optimizer (private to src/optim).
//
// Ranks that disagree on what they optimize issue different collectives: Dion2 with fraction
// 0.25 on one rank and 1.0 on another used to abort inside Gloo ("Received data size doesn't
// match"), and a rank holding 3 of another's 5 parameters finished with a silently wrong 4th
// matrix. check_ranks_agree() runs at the start of step() (and in init_state()), on every rank,
// before any algorithm's collective. It compares a fixed-size description of every parameter —
// global shape, dtype, layout (shard dims), algorithm and every option that changes
// communication (the hyperparameters whose rule says `comm`, dion/optim/hyperparameters.h) —
// across every axis of the Distribution, and raises dion::ValueError on EVERY rank, naming the parameter (group index and position) and both ranks' values.
//
// Cost: one 8-byte all_reduce per axis per step decides whether anything changed on any rank
// since the last agreement (first step, add_param_group, option edits, load); only then do the
// per-parameter descriptions travel (all_gather over each axis). Not here: shard-spec validity
// (Distributed::prepare checks each rank's own shards), values that do not change
// communication (lr, weight_decay, betas, ...).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "dion/optim/distribution.h"

namespace dion {

// `agreed`: the description all ranks last agreed on (updated on success; empty at first).
void check_ranks_agree(Distribution& dist, const std::vector<torch::optim::OptimizerParamGroup>& groups,
                       std::vector<int64_t>& agreed);

}  // namespace dion
