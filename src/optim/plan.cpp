// Megabatch plans: layout and communication of one megabatch (see plan.h).
#include "dion/optim/plan.h"

#include <sstream>
#include <string>

#include "dion/errors.h"

namespace dion {

Layout layout_of(const Distribution* dist, const at::Tensor& p) {
  return dist ? dist->layout(p) : Layout{p.sizes().vec(), -1, false};
}

Plan plan_for(const Layout& layout, int64_t world, size_t batch_size, const Options& o, size_t g) {
  Plan plan;
  plan.layout = layout;
  plan.world = world;
  plan.heads = o.num_heads() > 1 ? o.num_heads() : 0;
  const Layout& L = plan.layout;
  const int64_t ndim = static_cast<int64_t>(L.global_shape.size());
  std::ostringstream shape;
  shape << c10::IntArrayRef(L.global_shape);
  const std::string where = "param group " + std::to_string(g) + " (" + o.algorithm() + "), shape " + shape.str();
  if (L.own_group()) {
    // shard_over (expert parallelism): split along a batch dim over its own group, whole matrices
    // on every rank: orthogonalized where they are. A layout that would communicate is refused.
    plan.world = L.group->size();
    const std::string over = where + ", split on dim " + std::to_string(L.shard_dim) + " over group '" +
                             L.group->name() + "' (shard_over, expert parallelism)";
    const char* works = "; what works: an expert stack [E, out, in] split on a batch dim (dim 0), flatten off";
    if (L.shard_dim >= ndim - 2)
      throw NotImplementedError(over + ": a matrix dim is split, which would need communication over that group" +
                                works);
    if (o.flatten())
      throw NotImplementedError(over + ": flatten makes the stack one matrix split across that group" + works);
    if (plan.heads) throw NotImplementedError(over + ": num_heads is not supported" + works);
    return plan;
  }
  if (plan.heads) {
    // Whole heads on every rank: orthogonalize locally (the reference does the same).
    if (L.two_d()) throw NotImplementedError(where + ": num_heads with 2-D (FSDP x TP) sharding is not supported");
    if (L.sharded()) {
      if (L.shard_dim != 0)
        throw NotImplementedError(where +
                                  ": num_heads needs sharding on dim 0 (the heads dim) or none; "
                                  "sharded on dim " +
                                  std::to_string(L.shard_dim));
      if (plan.heads % plan.world != 0)
        throw ValueError(where + ": num_heads (" + std::to_string(plan.heads) +
                         ") must be divisible by the sharding world size (" + std::to_string(plan.world) +
                         ") so each rank holds whole heads");
    }
    return plan;
  }
  if (L.sharded()) {
    const bool matrix_dim = L.shard_dim >= ndim - 2;
    if (!o.flatten() && !matrix_dim && !L.two_d()) return plan;  // batch-sharded 3-D+: whole matrices here
    if (L.two_d() && o.flatten())
      throw NotImplementedError(where + ": flatten with 2-D (FSDP x TP) sharding is not supported");
    plan.communicate = true;
    plan.comm_dim = L.shard_dim - ndim;
    if (!o.split_sizes().empty()) {
      if (plan.comm_dim == -2 && L.global_shape[ndim - 2] % plan.world != 0)
        throw NotImplementedError(where + ": split_sizes requires dim 0 (" + std::to_string(L.global_shape[ndim - 2]) +
                                  ") to be divisible by the sharding world size (" + std::to_string(plan.world) +
                                  ") so the assembled matrices have no interspersed padding rows");
    }
    if (o.spec().check_plan) o.spec().check_plan(plan, o, where);  // the algorithm's own refusals
    return plan;
  }
  plan.communicate = L.replicated && batch_size > 1;  // DDP: split the megabatch across ranks
  return plan;
}

}  // namespace dion
