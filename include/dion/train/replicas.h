// dion/train/replicas.h — data-parallel replicas checked bit for bit.
//
// In DDP / HSDP every dp replica holds the same parameters and steps them with the same summed
// gradient, so they stay equal only if every rank computes the update the same way. Ranks whose
// kernels differ (other CPUs, other library versions, a bug) drift apart by rounding, silently;
// and a checkpoint keeps dp index 0's copy only. So the trainer compares them:
//
//   replicas_check(model, par, step);   // collective over the dp group; a no-op for dp 1
//
// Each rank hashes the bits of each of its parameter parts (an integer sum of the bit patterns,
// weighted by position: exact and independent of reduction order, so the same bits give the
// same hash on any CPU), all_gathers the hashes over dp (8 bytes a parameter) and compares
// them with dp rank 0's. A difference throws ReplicaDriftError on every rank of the dp group,
// naming the first parameter that differs, the step and the dp ranks.
//
// The tests see a drift caught by changing one bit of a rank's first parameter after a step
// (DION_TEST_PERTURB_REPLICA: TrainHooks::after_update, trainer.h, installed by
// tools/dion-train/test_hooks.h).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dion/train/gpt.h"

namespace dion::train {

class Parallel;  // dion/train/parallel.h

// Exit code 1.
class ReplicaDriftError : public std::runtime_error {
 public:
  explicit ReplicaDriftError(const std::string& message) : std::runtime_error(message) {}
};

// The bit hash of one tensor (any dtype, any device): the same bits, the same hash.
int64_t replicas_bit_hash(const at::Tensor& t);

void replicas_check(GPT& model, Parallel& par, int64_t step);

}  // namespace dion::train
