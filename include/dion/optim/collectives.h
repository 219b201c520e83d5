// dion/optim/collectives.h — every communication pattern of the algorithms, in one place (what
// a driver calls: dion/optim/driver.h Env::comm).
//
// The drivers (src/optim/drivers/) read as math plus calls to the named patterns below; the
// patterns speak to the Distribution's per-axis collectives (dion/optim/distribution.h; the
// megabatch assembly is assembly.h), never to c10d. Without a Distribution (one process) every
// pattern is the local computation alone. Tested in one process against
// tests/support/fake_distribution.h (W simulated ranks as tasks on one thread), which runs these
// same lines over in-process axis groups.
//
//   Gradients:   synced_gradients            optimizer-side DDP gradient averaging
//   Muon family: assemble_orthogonalize      whole matrices assembled, orthogonalized, split back
//                shard_sum / column_shards   NorMuon's norms summed over the shards / over column blocks
//   Dion2:       sum_norms_over_shards       partial L1 norms of slices split across shards
//                top_k_over_shards           the whole-matrix top-k of slices held by the shards
//   Dion:        orthonormalize_P_split_over_replicas   (DDP)
//                reduce_scatter_then_orthonormalize_P   (FSDP)
//                all_reduce_then_orthonormalize_P       (FSDP x TP)
//                sum_R_over_inner, sum_over_outer, average_over_replicas
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dion/math/normuon.h"
#include "dion/math/ortho.h"
#include "dion/optim/distribution.h"
#include "dion/optim/options.h"
#include "dion/optim/plan.h"

namespace dion {

class Collectives {
 public:
  explicit Collectives(Distribution* dist) : dist_(dist) {}
  Distribution* distribution() const { return dist_; }

  // ---- gradients
  // The parameters' gradients, averaged over the replicas when the Distribution asks the
  // optimizer to synchronize them (FSDP gradients arrive reduce-scattered: left alone unless
  // there is a replicate group).
  std::vector<at::Tensor> synced_gradients(const std::vector<at::Tensor>& params) const;
  void average_over_replicas_(at::Tensor& x) const;

  // ---- Muon family (and Dion2's submatrices)
  // U: the megabatch's N local matrices (whole, shards, or selected slices of `local_size`
  // along the comm dim). Returns the orthogonalized local parts [N, ...]: locally when the plan
  // does not communicate, else whole matrices are assembled on the ranks (DDP: each rank ~N/W
  // of them; FSDP: along the sharded dim), orthogonalized with `fn` and sent back. `order`
  // (top_k_over_shards): orthogonalize only those slices along `order_dim`, in that order.
  at::Tensor assemble_orthogonalize(std::vector<at::Tensor> U, const Plan& plan, const Options& o,
                                    const math::OrthoFn& fn, const std::vector<int64_t>& split_sizes,
                                    const std::vector<double>& split_scales, int64_t local_size = 0,
                                    int64_t inner_local_size = 0, std::vector<at::Tensor> order = {},
                                    int64_t order_dim = 0) const;
  // Sum over every rank holding a part of the same matrices (null when the matrices are whole
  // on each rank): NorMuon's Frobenius norms.
  math::ShardSum shard_sum(const Plan& plan) const;
  // When the columns are sharded (1-D on the last dim, or 2-D): the sum over the ranks holding
  // the other column blocks of the same rows, and the whole row length (NorMuon's per-neuron
  // means); empty when each rank holds whole rows.
  math::ColumnShards column_shards(const Plan& plan) const;

  // ---- Dion2
  // Add the other shards' partial L1 norms in place (slices split across the shards).
  math::ShardSum sum_norms_over_shards() const;
  // The whole-matrix top-k over slices held by the shards of axis `holder` (the axis sharding the
  // selection dim): `norms` [N, local] are this rank's slices' norms, partial over axis
  // `splitter` under 2-D sharding (summed here; an axis the Distribution lacks is a no-op).
  // Returns, for each matrix, this rank's selected slices (local indices, in top-k order), the
  // most slices any rank holds of any matrix (k_pad, the same on every rank), and where each
  // selected slice sits in the matrix assembled from k_pad slots a rank, in one process's order.
  struct ShardSelection {
    std::vector<at::Tensor> mine;   // [c_i] int64 per matrix
    std::vector<at::Tensor> order;  // [k] int64 per matrix: places in [0, W * k_pad)
    int64_t k_pad = 0;
  };
  ShardSelection top_k_over_shards(at::Tensor norms, int64_t k, int64_t global, Axis holder, Axis splitter) const;

  // ---- legacy Dion
  // DDP: each rank orthonormalizes ceil(N / W) of P [N, a, r]; one all_gather shares them.
  at::Tensor orthonormalize_P_split_over_replicas(const at::Tensor& P, float oversample) const;
  // FSDP: P [N, a, r] partial over the outer group -> summed and split (one all_to_all + local
  // sum), averaged over the replicas when `compressed`, orthonormalized, all-gathered.
  at::Tensor reduce_scatter_then_orthonormalize_P(const at::Tensor& P, float oversample, bool compressed) const;
  // FSDP x TP: P [N, a_local, r] summed over outer (and averaged over replicas when
  // `compressed`), its rows gathered over inner, orthonormalized on every rank with a sketch
  // generator seeded identically everywhere (`seed`); returns this rank's rows.
  at::Tensor all_reduce_then_orthonormalize_P(at::Tensor P, int64_t a, float oversample, bool compressed,
                                              uint64_t seed) const;
  void sum_R_over_inner_(at::Tensor& R) const;
  math::ShardSum sum_over_outer() const;
  bool sync_gradients() const;

 private:
  Distribution* dist_;  // null: one process
};

}  // namespace dion
