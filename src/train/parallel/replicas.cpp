// src/train/parallel/replicas.cpp — data-parallel replicas compared by a hash of their bits (replicas.h).
#include "dion/train/replicas.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "dion/comm/group.h"
#include "dion/train/parallel.h"

namespace dion::train {

int64_t replicas_bit_hash(const at::Tensor& t) {
  at::Tensor flat = t.detach().contiguous().view({-1});
  at::ScalarType bits_type;
  switch (flat.element_size()) {
    case 1:
      bits_type = at::kByte;
      break;
    case 2:
      bits_type = at::kShort;
      break;
    case 4:
      bits_type = at::kInt;
      break;
    default:
      bits_type = at::kLong;
      break;
  }
  if (flat.element_size() > 8) flat = flat.view(at::kByte);  // (complex128: bytes)
  at::Tensor bits = flat.view(bits_type);
  // Chunks bound the int64 temporaries (a 50304 x 768 embedding is 39M elements).
  constexpr int64_t kChunk = int64_t(1) << 22;
  at::Tensor hash = at::zeros({}, bits.options().dtype(at::kLong));  // on the tensor's device: one sync at the end
  for (int64_t start = 0; start < bits.numel(); start += kChunk) {
    const int64_t n = std::min(kChunk, bits.numel() - start);
    at::Tensor b = bits.narrow(0, start, n).to(at::kLong);
    // Weight by position (mod a prime, + 1) so that swapped elements change the hash; integer
    // sums wrap mod 2^64 in any order, so the hash does not depend on how the sum is reduced.
    at::Tensor w = at::arange(start, start + n, b.options()).remainder_(65521).add_(1);
    hash += b.mul_(w).sum();
  }
  return hash.item<int64_t>();
}

namespace {
// The first parameter whose hash differs from group rank 0's ("" when none): collective over `g`.
std::string first_drift(comm::Group& g, const char* axis, const std::vector<std::string>& names,
                        const std::vector<int64_t>& hashes, int64_t step, int rank) {
  const at::Tensor all = g.all_gather(at::tensor(hashes, at::kLong)).contiguous();  // [size, params]
  const auto h = all.accessor<int64_t, 2>();
  for (int r = 1; r < g.size(); ++r)
    for (size_t i = 0; i < names.size(); ++i)
      if (h[r][int64_t(i)] != h[0][int64_t(i)])
        return fmt::format(
            "after step {}: the data-parallel replicas differ: parameter '{}' on {} rank {} is not bit-identical to "
            "{} rank 0's (this is global rank {}). The ranks computed the same update differently (different CPUs or "
            "library versions on the hosts, or a bug); resume from the last checkpoint on uniform hosts "
            "(docs/train.md \"Replica check\")",
            step, names[i], axis, r, axis, rank);
  return "";
}
}  // namespace

void replicas_check(GPT& model, Parallel& par, int64_t step) {
  // Each parameter is compared over the group of its replicas (layout.h: dp, or edp for the
  // expert stacks under ep).
  const Mesh& mesh = par.mesh();
  std::vector<std::string> names[kReplicaAxes];
  std::vector<int64_t> hashes[kReplicaAxes];
  bool any = false;
  for (int k = 0; k < kReplicaAxes; ++k) {
    const auto& g = mesh.replicas(ReplicaAxis(k));
    any = any || (g && g->size() > 1);
  }
  if (!any) return;
  for (const auto& item : model->named_parameters()) {
    const int k = int(mesh.layout().replica_axis(par.placement(item.value())));
    names[k].push_back(item.key());
    hashes[k].push_back(replicas_bit_hash(item.value()));
  }
  std::string message;
  for (int k = 0; k < kReplicaAxes; ++k) {
    const auto& g = mesh.replicas(ReplicaAxis(k));
    if (!g || g->size() == 1) continue;
    const std::string m = first_drift(*g, replica_axis_name(ReplicaAxis(k)), names[k], hashes[k], step, mesh.rank());
    if (message.empty()) message = m;
  }
  // Every rank stops, also those of dp groups whose replicas agree (they would wait in the next
  // collective otherwise).
  at::Tensor bad = at::tensor({message.empty() ? int64_t(0) : int64_t(1)}, at::kLong);
  par.mesh().world().all_reduce_(bad);
  if (!message.empty()) throw ReplicaDriftError(message);
  if (bad.item<int64_t>() > 0)
    throw ReplicaDriftError(
        fmt::format("after step {}: the data-parallel replicas of another dp group differ (its "
                    "ranks name the parameter); stopping with them",
                    step));
}

}  // namespace dion::train
