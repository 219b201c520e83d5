// src/math/elementwise.cpp — the fused element-wise kernels' switch and checks
// (dion/math/elementwise.h): DION_DISABLE_FUSED, cpu_fusable, and the argument checks and the
// lerp capability test the kernels' sources share (elementwise_detail.h). The kernels are
// elementwise_state.cpp (the optimizer state) and elementwise_update.cpp (the weights).
#include "dion/math/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "elementwise_detail.h"

namespace dion::math::cpu {

// ---------------------------------------------------------------------------- checks

bool fused_kernels_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DION_DISABLE_FUSED");
    return v == nullptr || std::string(v).empty() || std::string(v) == "0";
  }();
  return enabled;
}

bool cpu_fusable(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C) {
  if (!fused_kernels_enabled()) return false;
  auto ok = [&A](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.is_contiguous() && t.numel() == A.numel() &&
           (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  return ok(A) && ok(B) && (!C.defined() || ok(C));
}

namespace detail {

// Whether ATen's lerp runs as an FMA here (elementwise_detail.h says when it does).
bool aten_lerp_uses_fma() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool fma = at::get_cpu_capability() != "DEFAULT";
#else
  static const bool fma = true;
#endif
  return fma;
}

void check_select_dim(int64_t select_dim, const char* who) {
  TORCH_CHECK(select_dim == -2 || select_dim == -1, who, ": select_dim must be -2 (rows) or -1 (columns), got ",
              select_dim);
}

void check_matrix(const at::Tensor& t, const char* who, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.device().is_cpu(), who, ": ", name,
              " must be a contiguous CPU matrix [m, n], got ", t.sizes());
}

std::vector<int64_t> indices_of(const at::Tensor& idx, int64_t size, const char* who) {
  TORCH_CHECK(idx.dim() == 1 && idx.scalar_type() == at::kLong && idx.device().is_cpu(), who,
              ": idx must be a 1-D int64 CPU tensor, got ", idx.sizes(), " ", idx.scalar_type());
  const at::Tensor c = idx.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  std::vector<int64_t> out(p, p + c.numel());
  for (int64_t i : out) TORCH_CHECK(i >= 0 && i < size, who, ": index ", i, " out of range [0, ", size, ")");
  return out;
}

namespace {
void check_selected(const at::Tensor& A, const at::Tensor& U, int64_t k, int64_t select_dim, const char* who) {
  const int64_t rows = select_dim == -2 ? k : A.size(0), cols = select_dim == -2 ? A.size(1) : k;
  TORCH_CHECK(U.dim() == 2 && U.size(0) == rows && U.size(1) == cols && U.is_contiguous() && U.device().is_cpu() &&
                  (U.scalar_type() == at::kFloat || U.scalar_type() == at::kBFloat16),
              who, ": U must be a contiguous float32 / bfloat16 CPU matrix [", rows, ", ", cols, "], got ", U.sizes(),
              " ", U.scalar_type());
}
}  // namespace

std::vector<int64_t> checked_selection(const at::Tensor& A, const char* name, const at::Tensor& idx,
                                       const at::Tensor& U, int64_t select_dim, const char* who) {
  check_select_dim(select_dim, who);
  check_matrix(A, who, name);
  TORCH_CHECK(A.scalar_type() == at::kFloat || A.scalar_type() == at::kBFloat16, who, ": ", name,
              " must be float32 or bfloat16, got ", A.scalar_type());
  std::vector<int64_t> sel = indices_of(idx, select_dim == -2 ? A.size(0) : A.size(1), who);
  check_selected(A, U, static_cast<int64_t>(sel.size()), select_dim, who);
  return sel;
}

}  // namespace detail

}  // namespace dion::math::cpu
