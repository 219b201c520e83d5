// src/math/elementwise_state.cpp — the fused kernels that update the optimizer state
// (dion/math/elementwise.h): momentum, accumulation with slice L1 norms, selection of slices
// with error-feedback decay, accumulation with a copy. Each kernel's comment names the ATen
// composition it reproduces; every intermediate is rounded where that composition stores a
// result.
#include "dion/math/elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "elementwise_detail.h"

namespace dion::math::cpu {

using namespace detail;  // the element types, lerp, sign and the checks

// ---------------------------------------------------------------------------- momentum

void momentum_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& U, float mu, bool nesterov) {
  TORCH_CHECK(cpu_fusable(M, G, U), "momentum_: M, G (and U) must be contiguous float32 / bfloat16 CPU tensors of ",
              M.numel(), " elements");
  const int64_t n = M.numel();
  const bool write_u = U.defined();
  const at::ScalarType u_type = write_u ? U.scalar_type() : M.scalar_type();
  with_types(M.scalar_type(), G.scalar_type(), u_type, [&](auto tm, auto tg, auto tu) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    using TU = decltype(tu);
    auto* m = ptr<TM>(M);
    const auto* g_in = ptr<TG>(G);
    auto* u = write_u ? ptr<TU>(U) : nullptr;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (write_u && nesterov) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          const float m_new = TM::round(TM::round(TM::load(m[i]) * mu) + g);
          m[i] = TM::store(m_new);
          u[i] = TU::store(TM::round(TM::round(m_new * mu) + g));
        }
      } else if (write_u) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          const float m_new = TM::round(TM::round(TM::load(m[i]) * mu) + g);
          m[i] = TM::store(m_new);
          u[i] = TU::store(m_new);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const float g = TM::round(TG::load(g_in[i]));
          m[i] = TM::store(TM::round(TM::load(m[i]) * mu) + g);
        }
      }
    });
  });
}

// ---------------------------------------------------------------------------- accumulation, L1 norms

void accumulate_l1_norms_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& norms, int64_t select_dim) {
  constexpr const char* who = "accumulate_l1_norms_";
  check_select_dim(select_dim, who);
  check_matrix(M, who, "M");
  TORCH_CHECK(cpu_fusable(M, G), who, ": G must be a contiguous float32 / bfloat16 CPU tensor like M ", M.sizes());
  const int64_t rows = M.size(0), cols = M.size(1);
  const int64_t n_select = select_dim == -2 ? rows : cols;
  TORCH_CHECK(
      norms.dim() == 1 && norms.size(0) == n_select && norms.is_contiguous() && norms.scalar_type() == M.scalar_type(),
      who, ": norms must be a contiguous [", n_select, "] tensor of M's dtype, got ", norms.sizes(), " ",
      norms.scalar_type());
  with_types(M.scalar_type(), G.scalar_type(), [&](auto tm, auto tg) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    auto* m = ptr<TM>(M);
    const auto* g = ptr<TG>(G);
    auto* out = ptr<TM>(norms);
    auto add_row = [&](int64_t r) {
      auto* mr = m + r * cols;
      const auto* gr = g + r * cols;
      for (int64_t j = 0; j < cols; ++j) mr[j] = TM::store(TM::load(mr[j]) + TM::round(TG::load(gr[j])));
    };
    if (select_dim == -2) {
      // Row norms: each a serial float sum along its row (as ATen's reduction); rows in
      // groups of 8 so that 8 independent sums hide the add latency.
      constexpr int64_t kRows = 8;
      at::parallel_for(0, (rows + kRows - 1) / kRows, kGrain / (kRows * cols) + 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * kRows, nr = std::min(kRows, rows - r0);
          float acc[kRows] = {};
          for (int64_t r = 0; r < nr; ++r) add_row(r0 + r);
          const auto* base = m + r0 * cols;
          if (nr == kRows) {
            for (int64_t j = 0; j < cols; ++j)
              for (int64_t r = 0; r < kRows; ++r) acc[r] += std::fabs(TM::load(base[r * cols + j]));
          } else {
            for (int64_t r = 0; r < nr; ++r)
              for (int64_t j = 0; j < cols; ++j) acc[r] += std::fabs(TM::load(base[r * cols + j]));
          }
          for (int64_t r = 0; r < nr; ++r) out[r0 + r] = TM::store(acc[r]);
        }
      });
    } else {
      // Column norms: every column's serial sum runs down the rows, all columns at once.
      std::vector<float> acc(static_cast<size_t>(cols), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        add_row(r);
        const auto* mr = m + r * cols;
        for (int64_t j = 0; j < cols; ++j) acc[static_cast<size_t>(j)] += std::fabs(TM::load(mr[j]));
      }
      for (int64_t j = 0; j < cols; ++j) out[j] = TM::store(acc[static_cast<size_t>(j)]);
    }
  });
}

// ---------------------------------------------------------------------------- selection, error feedback

void take_selected_(const at::Tensor& M, const at::Tensor& idx, const at::Tensor& U, float ef_decay,
                    int64_t select_dim) {
  const std::vector<int64_t> sel = checked_selection(M, "M", idx, U, select_dim, "take_selected_");
  const int64_t rows = M.size(0), cols = M.size(1), k = static_cast<int64_t>(sel.size());
  with_types(M.scalar_type(), U.scalar_type(), [&](auto tm, auto tu) {
    using TM = decltype(tm);
    using TU = decltype(tu);
    auto* m = ptr<TM>(M);
    auto* u = ptr<TU>(U);
    auto take = [&](typename TM::storage& src, typename TU::storage& dst) {
      const float v = TM::load(src);
      dst = TU::store(v);             // selected.to(comm dtype)
      src = TM::store(v * ef_decay);  // scatter_(selected * ef_decay)
    };
    if (select_dim == -2) {
      for (int64_t j = 0; j < k; ++j) {
        auto* mr = m + sel[static_cast<size_t>(j)] * cols;
        auto* ur = u + j * cols;
        for (int64_t c = 0; c < cols; ++c) take(mr[c], ur[c]);
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        auto* mr = m + r * cols;
        auto* ur = u + r * k;
        for (int64_t j = 0; j < k; ++j) take(mr[sel[static_cast<size_t>(j)]], ur[j]);
      }
    }
  });
}

// ---------------------------------------------------------------------------- accumulation, copy

void add_and_copy_(const at::Tensor& M, const at::Tensor& G, const at::Tensor& out, bool transpose) {
  constexpr const char* who = "add_and_copy_";
  check_matrix(M, who, "M");
  check_matrix(out, who, "out");
  TORCH_CHECK(cpu_fusable(M, G), who, ": G must be a contiguous float32 / bfloat16 CPU tensor like M ", M.sizes());
  const int64_t rows = M.size(0), cols = M.size(1);
  TORCH_CHECK(out.scalar_type() == M.scalar_type() && out.size(0) == (transpose ? cols : rows) &&
                  out.size(1) == (transpose ? rows : cols),
              who, ": out must be M's dtype and shape", transpose ? " transposed" : "", ", got ", out.sizes());
  with_types(M.scalar_type(), G.scalar_type(), [&](auto tm, auto tg) {
    using TM = decltype(tm);
    using TG = decltype(tg);
    auto* m = ptr<TM>(M);
    const auto* g = ptr<TG>(G);
    auto* o = ptr<TM>(out);
    if (!transpose) {
      at::parallel_for(0, rows * cols, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const auto v = TM::store(TM::load(m[i]) + TG::load(g[i]));
          m[i] = v;
          o[i] = v;
        }
      });
      return;
    }
    constexpr int64_t kTile = 16;  // the transposed writes stay within one tile's cache lines
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < cols; ++c)
          m[r * cols + c] = TM::store(TM::load(m[r * cols + c]) + TG::load(g[r * cols + c]));
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) o[c * rows + r] = m[r * cols + c];
      }
    }
  });
}

}  // namespace dion::math::cpu
