// Legacy Dion: its spec and one megabatch's low-rank power-iteration update (the reference's dion/dion.py:
// dion_update_ddp, dion_update_fsdp, dion_update_fsdp_tp).
//
//   P = M Q (M += G first);  P -> orthonormalized;  R = M^T P;  M -= (1 - mu) P R^T;
//   Q = column-normalized R;  X *= 1 - lr wd;  X -= lr * scale * P Q^T     (dion/math/dion.h)
//
// Where P and R travel (collectives.h):
//   single process / not distributed: all local (math::dion_step)
//   DDP:  each rank orthonormalizes ~N/W of the batch's P (orthonormalize_P_split_over_replicas);
//         with optimizer-side gradient sync, P and R are averaged over the replicas instead of
//         the gradients when that moves fewer bytes: (m + n) r < m n ("compressed")
//   FSDP (outer) and FSDP x TP (outer x inner): M_batch [a, b] is M or M^T with the
//         outer-sharded dim as b (so Q [b, r] is sharded like it) and the inner-sharded dim, if
//         any, as a. P partial over outer: reduce-scattered (1-D) or all-reduced then gathered
//         over inner (2-D); R partial over inner: summed; Q's column norms summed over outer.
#include <ATen/ATen.h>

#include "dion/math/dion.h"
#include "dion/errors.h"
#include "../state_layout.h"
#include "dion/optim/driver.h"

namespace dion::driver {

namespace {

struct DionOperands {
  std::vector<at::Tensor> G, M, Q;
};

// Optimizer-side sync of whole gradients (when P and R are not averaged instead).
void average_gradients(std::vector<at::Tensor>& G, const Collectives& comm) {
  for (at::Tensor& g : G) {
    g = g.clone(at::MemoryFormat::Contiguous);
    comm.average_over_replicas_(g);
  }
}

void dion_update_ddp(const Batch& batch, DionOperands ops, const Options& o, const Collectives& comm,
                     const math::Rates& rates) {
  const int64_t m = batch.params[0].size(0), n = batch.params[0].size(1);
  const int64_t r = ops.Q[0].size(1);
  const bool sync = comm.sync_gradients();
  const bool compressed = sync && o.rank_fraction() < 1.0 && (m + n) * r < m * n;
  if (sync && !compressed) average_gradients(ops.G, comm);
  math::DionBatch b = math::dion_power(ops.G, ops.M, ops.Q);
  at::Tensor P = b.P.contiguous();
  if (compressed) comm.average_over_replicas_(P);
  P = comm.orthonormalize_P_split_over_replicas(P, f32(o.oversample()));
  at::Tensor R = math::dion_R(b, P).contiguous();
  if (compressed) comm.average_over_replicas_(R);
  math::dion_finish(batch.params, ops.M, ops.Q, b, P, R, rates, f32(o.mu()), f32(o.epsilon()));
}

void dion_update_fsdp(const Batch& batch, DionOperands ops, const Layout& L, const Options& o, const Collectives& comm,
                      const math::Rates& rates) {
  const int64_t m = L.global_shape[0], n = L.global_shape[1];
  const bool transposed = math::dion_is_transposed_sharded(m, n, L.shard_dim, L.inner_dim);
  const int64_t r = ops.Q[0].size(1);
  const bool sync = comm.sync_gradients() && comm.distribution()->axis_size(Axis::REPLICA) > 1;
  const bool compressed = sync && o.rank_fraction() < 1.0 && (m + n) * r < m * n;
  if (sync && !compressed) average_gradients(ops.G, comm);
  math::DionBatch b = math::dion_power(ops.G, ops.M, ops.Q, transposed ? 1 : 0);
  at::Tensor P = b.P.contiguous();  // [N, a_local, r], partial over outer
  const float oversample = f32(o.oversample());
  if (!L.two_d()) {
    P = comm.reduce_scatter_then_orthonormalize_P(P, oversample, compressed);
  } else {
    const int64_t a = transposed ? n : m;
    const uint64_t seed =
        static_cast<uint64_t>(o.step()) * 1000003ULL + static_cast<uint64_t>(a) * 131ULL + static_cast<uint64_t>(r);
    P = comm.all_reduce_then_orthonormalize_P(P, a, oversample, compressed, seed);
  }
  at::Tensor R = math::dion_R(b, P).contiguous();  // [N, b_local, r]
  if (L.two_d()) comm.sum_R_over_inner_(R);
  if (compressed) comm.average_over_replicas_(R);
  math::dion_finish(batch.params, ops.M, ops.Q, b, P, R, rates, f32(o.mu()), f32(o.epsilon()), L.global_shape,
                    comm.sum_over_outer());
}

void dion_update(const Batch& batch, const Options& o, const Env& env) {
  const Collectives& comm = *env.comm;
  DionOperands ops;
  for (const at::Tensor& p : batch.params) ops.G.push_back(p.grad());
  for (ParamState* s : batch.state) {
    ops.M.push_back(s->momentum());
    ops.Q.push_back(s->Q());
  }
  const Layout& layout = batch.plan.layout;
  const math::Rates rates = rates_for(batch, o, env);
  if (layout.sharded()) return dion_update_fsdp(batch, std::move(ops), layout, o, comm, rates);
  if (!comm.distribution() || !layout.replicated) {
    math::dion_step(batch.params, ops.G, ops.M, ops.Q, rates, f32(o.mu()), f32(o.epsilon()), f32(o.oversample()));
    return;
  }
  dion_update_ddp(batch, std::move(ops), o, comm, rates);
}

AlgorithmSpec dion_spec() {
  AlgorithmSpec s;
  s.name = "dion";
  s.serial = true;  // Q is drawn at random when the state is created
  s.state = [](const ParamView& p, const Options& o) {
    // Q [n', r] for the whole matrix; a sharded parameter keeps the rows of its outer chunk.
    const Layout L = layout_of(p.dist, p.param);
    const QRows q = q_rows_of(L, axis_place(p.dist));  // src/optim/state_layout.h
    const int64_t r = math::dion_rank(L.global_shape[0], L.global_shape[1], o.rank_fraction(), o.rank_multiple_of());
    return std::vector<StateSpec>{momentum_like(p, o.momentum_dtype()),
                                  {"Q",
                                   {L.sharded() ? q.length : q.rows, r},
                                   o.Q_dtype().value_or(p.param.scalar_type()),
                                   StateLayout::OUTER_ROWS}};
  };
  s.initial_state = [](const ParamView& p, const StateSpec& st) {
    if (st.key != "Q") return at::Tensor();
    // Every rank draws the same whole Q from an identically seeded generator and keeps its rows.
    const Layout L = layout_of(p.dist, p.param);
    const QRows q = q_rows_of(L, axis_place(p.dist));
    at::Tensor Q = at::randn({q.rows, st.shape[1]}, p.param.options().dtype(st.dtype));
    return L.sharded() ? Q.narrow(0, q.start, q.length).clone() : Q;
  };
  s.check_options = [](const Options& o) -> std::optional<OptionError> {
    if (o.weight_decay() < 0.0) return OptionError{"weight_decay", "must be finite, and >= 0 for dion"};
    return std::nullopt;
  };
  s.check_param = [](const ParamView& p, const Options&, const std::string& what) {
    const char* instead =
        "; for expert weights (an MoE's [E, out, in] stacks, expert parallelism) use Muon, "
        "NorMuon, Dion2 or Dion3";
    if (p.dist && p.dist->layout(p.param).own_group())
      throw NotImplementedError(what + ": legacy 'dion' does not support expert-parallel parameters (shard_over)" +
                                instead);
    if (p.param.dim() != 2) throw NotImplementedError(what + ": legacy 'dion' supports 2-D parameters only" + instead);
  };
  s.update = dion_update;
  return s;
}

}  // namespace

}  // namespace dion::driver

DION_BUILTIN_DRIVER(dion) { register_algorithm(driver::dion_spec()); }
