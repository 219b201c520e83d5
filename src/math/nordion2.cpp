// NorDion2 / Dion3 normalization of the selected rows (see include/dion/math/nordion2.h).
#include "dion/math/nordion2.h"

#include <ATen/ATen.h>

#include "dion/math/normuon.h"

namespace dion::math {

std::pair<at::Tensor, at::Tensor> nordion2_normalize_selected(const at::Tensor& U,
                                                              const at::Tensor& V,
                                                              const at::Tensor& indices,
                                                              float beta2) {
  at::Tensor idx = indices.unsqueeze(-1);                              // [N, .., k, 1]
  at::Tensor V_sel = at::gather(V, -2, idx).to(at::kFloat);            // [N, .., k, 1]
  auto [U_normed, V_sel_new] = normuon_normalize(U, V_sel, beta2);
  at::Tensor V_new = V.scatter(-2, idx, V_sel_new.to(V.scalar_type()));
  return {U_normed, V_new};
}

}  // namespace dion::math
