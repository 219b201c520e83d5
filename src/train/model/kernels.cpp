// src/train/model/kernels.cpp — the exact and fast GEMMs and lm_head + cross entropy (kernels.h).
#include "dion/train/kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cross_entropy_cpu.h"
#include "transpose_cpu.h"
#include "dion/math/ortho.h"
#include "dion/train/autocast.h"

namespace dion::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// oneDNN's linear as LibTorch registers it (aten/src/ATen/native/mkldnn/Linear.cpp, the op
// torch.compile's CPU backend calls): Y = X W^T with W [out, in]; no post-op.
const c10::OperatorHandle* onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op ? &*op : nullptr;
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w) {
  torch::jit::Stack stack{x,
                          w,
                          c10::IValue(),
                          c10::IValue("none"),
                          c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue(std::string())};
  onednn_linear_op()->callBoxed(&stack);
  return stack[0].toTensor();
}

// A product whose row count varies (Shape::varies) runs through oneDNN on a row count rounded up
// to a multiple of this, so that its kernels repeat: oneDNN builds one per shape (its cache keeps
// 1024). [700-1400, 128] x [128, 170] on a Zen 4, one thread: a new row count each call 0.72-0.99
// ms a call, one row count 0.45, rounded up to 32 0.48-0.5 (1.5% more rows at 1024).
constexpr int64_t kVaryingRowsStep = 32;

// x [n, K] (row-major) as n_pad >= n rows: the rows that follow it in its own storage where it has
// them (the next expert's rows of a grouped buffer: each output row depends on its own input row
// only, and the extra ones are dropped), else a zero-padded copy.
at::Tensor rows_padded(const at::Tensor& x, int64_t n_pad) {
  const int64_t n = x.size(0), K = x.size(1);
  if (n_pad == n) return x;
  const int64_t stored = static_cast<int64_t>(x.storage().nbytes() / x.element_size()) - x.storage_offset();
  if (K > 0 && stored / K >= n_pad) return x.as_strided({n_pad, K}, {K, 1});
  at::Tensor padded = at::zeros({n_pad, K}, x.options());
  padded.narrow(0, 0, n).copy_(x);
  return padded;
}

// f(x) on x's rows rounded up to kVaryingRowsStep, the first n rows of its result (a row-major x;
// otherwise, or when no row is added, f(x) itself).
template <class F>
at::Tensor on_rounded_rows(const at::Tensor& x, F&& f) {
  const int64_t n = x.size(0), n_pad = (n + kVaryingRowsStep - 1) / kVaryingRowsStep * kVaryingRowsStep;
  if (n == 0 || n_pad == n || !x.is_contiguous()) return f(x);
  return f(rows_padded(x, n_pad)).narrow(0, 0, n);
}

// ATen's CPU bf16 mm is oneDNN's too, with a kernel per shape: a new row count each call took
// 0.76 ms a call for [700-1400, 128] x [128, 170] on a Zen 4, one row count 0.24, rounded up to 32
// 0.29. The fast kind treats a varying bf16 product as a oneDNN one (matmul_2d).
bool bf16_mm_jit(const at::Tensor& a, const at::Tensor& b, Kernels kind) {
  return kind == Kernels::fast && a.device().is_cpu() && a.scalar_type() == at::kBFloat16 &&
         b.scalar_type() == at::kBFloat16 && a.dim() == 2;
}

// A varying bf16 product whose reduction dim is the rows (a = X^T, X a row-major block of rows, b
// its rows: an expert's weight gradient): the rows rounded down to kVaryingRowsStep and the rest, as
// two products added, so that both shapes repeat (zero rows would need copies of both operands: the
// rows after a block in its storage are another expert's). The MoE config in bf16, one rank, Zen 4:
// 355-365 ms a step over steps 3-8 from a checkpoint, settling to ~315 only after ~25 steps as
// oneDNN's cache filled, against ~315 from step 3 with the split. Not for fp32's oneDNN plan,
// where it measured no faster (400-420 vs 400 ms).
template <class F>
at::Tensor on_split_reduction(const at::Tensor& a, const at::Tensor& b, F&& product) {
  const int64_t k = a.size(1), k_main = k / kVaryingRowsStep * kVaryingRowsStep;
  if (k_main == 0 || k_main == k) return product(a, b);
  return product(a.narrow(1, 0, k_main), b.narrow(0, 0, k_main))
      .add_(product(a.narrow(1, k_main, k - k_main), b.narrow(0, k_main, k - k_main)));
}

// The fast kind's own autograd functions run on fp32 with autocast off (linear() and
// linear_cross_entropy() send everything else to ATen); a backward() called inside an autocast
// region must not re-cast their GEMMs either.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

// fp32 operands and no autocast on their device: what the fast kind's functions compute.
bool fast_applies(const at::Tensor& x, const at::Tensor& w) {
  return x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && !autocast_dtype(x.device().type());
}

struct FastLinearFn : torch::autograd::Function<FastLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return linear_forward(x, w, Kernels::fast);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = linear_dx(grads[0], w, x.sizes(), Kernels::fast);
    if (ctx->needs_input_grad(1)) dw = linear_dw(grads[0], x, Kernels::fast);
    return {dx, dw};
  }
};

// The CPU's vendor and x86 family from CPUID (leaf 0's vendor string; leaf 1's base family, plus
// the extended family where the base is 0xF). Elsewhere: not Intel, family 0.
struct CpuKind {
  bool intel = false;
  unsigned family = 0;
};
CpuKind cpu_kind() {
  CpuKind kind;
#if defined(__x86_64__) || defined(__i386__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    char vendor[13];
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    vendor[12] = 0;
    kind.intel = std::strcmp(vendor, "GenuineIntel") == 0;
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    const unsigned base = (eax >> 8) & 0xF;
    kind.family = base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
  }
#endif
  return kind;
}

// The fast kind's fp32 GEMMs on this CPU. AMD Zen 5: oneDNN, 2-2.5x MKL's sgemm there (MKL's
// AVX2 zen kernels against oneDNN's full-width AVX-512). Intel: MKL's own path is as fast as oneDNN per GEMM
// (bench/fp32_gemm_paths.py) and takes `out` tensors, which the chunked loss writes into (no
// copies of dh's rows or of dW); on a Xeon with AMX, MKL's plan took 386-399 ms a forward +
// backward against 512-544 for oneDNN's before the loss kernel, 343-386 with it (2 x 128, fp32,
// one thread, CHANGELOG.md 2026-12-07).
// AMD before Zen 5 (family 0x19 and below: Zen 3's AVX2, Zen 4's AVX-512 on 256-bit units; measured
// on a Zen 4, and on it under scripts/test_avx2.sh's caps for Zen 3's instructions, where mixed was
// the fastest of the three too: bench/results/train_speed/fp32_plans_avx2caps_zen4_2026-12-07.txt):
// MKL's zen kernels run about as fast as oneDNN's (within 10%, bench/fp32_gemm_paths.py), and a
// product whose left operand is transposed (the blocks' dW) costs oneDNN's _linear_pointwise a
// copy of that operand, which MKL reads in place (the blocks' dW: MKL 0-15% faster; the lm_head's
// dW goes transposed through oneDNN in both plans, LinearCrossEntropyFn below): "mixed", such
// products through MKL, the rest through oneDNN. Zen 5's full-width AVX-512 runs oneDNN 2-2.5x
// MKL: oneDNN throughout.
// DION_FAST_FP32=onednn|mkl|mixed chooses (benchmarks, tests).
enum class Fp32Gemms { mkl, onednn, mixed };

Fp32Gemms fast_fp32_gemms() {
  static const Fp32Gemms gemms = [] {
    const char* env = std::getenv("DION_FAST_FP32");
    const std::string choice = env ? env : "";
    TORCH_CHECK(choice.empty() || choice == "mkl" || choice == "onednn" || choice == "mixed", "DION_FAST_FP32='",
                choice, "': valid values are 'mkl', 'onednn' and 'mixed' (unset: by CPU)");
    if (choice == "mkl") return Fp32Gemms::mkl;
    if (choice == "onednn") return Fp32Gemms::onednn;
    if (choice == "mixed") return Fp32Gemms::mixed;
    const CpuKind cpu = cpu_kind();
    if (cpu.intel) return Fp32Gemms::mkl;
    return cpu.family != 0 && cpu.family < 0x1A ? Fp32Gemms::mixed : Fp32Gemms::onednn;
  }();
  return gemms;
}

// fp32 only: for bf16, ATen's mm is already oneDNN's bf16 GEMM (and measured faster than
// _linear_pointwise for the transposed operands of the backward).
bool matmul_uses_onednn(const at::Tensor& a, const at::Tensor& b, Kernels kind) {
  if (kind != Kernels::fast || !a.device().is_cpu() || a.scalar_type() != at::kFloat ||
      b.scalar_type() != at::kFloat || !onednn_linear_available())
    return false;
  switch (fast_fp32_gemms()) {
    case Fp32Gemms::mkl: return false;
    case Fp32Gemms::onednn: return true;
    case Fp32Gemms::mixed: return a.is_contiguous();  // a transposed left operand: MKL, no copy
  }
  return true;
}

// The fused, chunked lm_head + cross entropy, fp32. Forward: per chunk of rows, logits [n, V],
// their log-softmax, the chunk's summed loss (- log p of each target); with `want_grad`, the
// logits become (softmax - onehot) / n_valid in place and give dh (rows of the chunk) and dW
// (accumulated). With the one-pass loss kernel (cross_entropy_cpu.h: AVX-512 or AVX2) the kernel
// does the loss and the gradient in one read of each row, where ATen's log-softmax, exp, scatter
// and scale stream the whole chunk about five times (ATen's ops remain where the kernel does not
// run); it leaves the gradient unscaled (its row factors k go on the GEMMs' [n, C] sides: no
// pass over the [n, V] chunk to scale it). Where the plan runs oneDNN (its onednn and mixed
// kinds), dW accumulates transposed, dW^T = (diag(k) h)^T G' [C, V], whose [n, V] operand G' oneDNN
// reads in place as its weight, where G'^T (diag(k) h) has it copy the transposed chunk (onednn) or
// MKL pack it (mixed); the last chunk's part added as dW^T goes into dW transposed
// (transpose_cpu.h). On a Zen 4, a 256-row chunk: 30-32 ms against MKL's 36 and oneDNN's 48 with
// its copy; the last sum and transpose 6.6 ms a step (ATen's add and copy_: 10.5). Its memory:
// dW^T, a chunk's part and oneDNN's working copy of G': the 2 x 128 run's peak RSS 742 -> 890 MB.
// Backward scales the kept dh, dW by the loss's gradient.
struct LinearCrossEntropyFn : torch::autograd::Function<LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                            int64_t ignore_index, bool want_grad) {
    const bool kernel = h.device().is_cpu() && cross_entropy_inplace_available(at::kFloat);
    return kernel ? forward_kernel(ctx, h, w, targets, ignore_index, want_grad)
                  : forward_aten(ctx, h, w, targets, ignore_index, want_grad);
  }

  static at::Tensor forward_kernel(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                                   const at::Tensor& targets, int64_t ignore_index, bool want_grad) {
    const int64_t N = h.size(0), V = w.size(0);
    const at::Tensor cpu_targets = targets.to(at::kCPU);
    const int64_t n_valid = cpu_targets.ne(ignore_index).sum().item<int64_t>();
    const float scale = n_valid > 0 ? 1.0f / static_cast<float>(n_valid) : 0.0f;
    // MKL writes each product in place; oneDNN's result is copied in (matmul_2d_out) or added.
    const bool in_place = !matmul_uses_onednn(h, w, Kernels::fast);
    const bool dw_transposed = !in_place;
    at::Tensor dh, dw, dw_t;  // dw_t: dW^T [C, V] where dw_transposed
    if (want_grad) {
      dh = at::empty_like(h);
      dw = N > 0 ? at::empty({V, h.size(1)}, h.options()) : at::zeros({V, h.size(1)}, h.options());  // (N > 0: written)
    }
    double sum = 0;
    const int64_t chunk = kCrossEntropyChunkRows;
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor hc = h.narrow(0, s, n);
      at::Tensor lg = in_place ? at::empty({n, V}, h.options()) : matmul_2d(hc, w.t(), Kernels::fast);  // [n, V]
      if (in_place) at::mm_out(lg, hc, w.t());
      at::Tensor k;  // [n]: the rows' factors of the unscaled gradient G' now in lg (cross_entropy_cpu.h)
      sum += cross_entropy_inplace(lg, cpu_targets.narrow(0, s, n), ignore_index, scale, want_grad,
                                   want_grad ? &k : nullptr);
      if (!want_grad) continue;
      const at::Tensor k_col = k.unsqueeze(1), hk = hc * k_col;  // diag(k) h, [n, C]
      at::Tensor dhc = dh.narrow(0, s, n);
      matmul_2d_out(dhc, lg, w, Kernels::fast);  // G' w, [n, C]
      dhc.mul_(k_col);                           // diag(k) G' w
      if (dw_transposed) {
        const at::Tensor part = onednn_linear(hk.t().contiguous(), lg.t());  // (diag(k) h)^T G', [C, V]
        const bool last = s + n >= N;
        if (s == 0 && last)
          dw.copy_(part.t());  // one chunk
        else if (s == 0)
          dw_t = part;
        else if (!last)
          dw_t.add_(part);
        else
          transpose_sum_into(dw, dw_t, part);  // the last chunk: dW = (dW^T + part)^T
      } else if (s == 0) {
        at::mm_out(dw, lg.t(), hk);  // G'^T (diag(k) h), [V, C]: MKL reads the transposed chunk
      } else {
        dw.addmm_(lg.t(), hk);
      }
    }
    if (want_grad) ctx->save_for_backward({dh, dw});
    // The mean over valid rows; none valid: nan, as F.cross_entropy.
    const double mean = n_valid > 0 ? sum / static_cast<double>(n_valid) : std::nan("");
    return at::scalar_tensor(mean, h.options());
  }

  static at::Tensor forward_aten(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                                 const at::Tensor& targets, int64_t ignore_index, bool want_grad) {
    const int64_t N = h.size(0), V = w.size(0);
    const auto f32 = h.options().dtype(at::kFloat);
    const at::Tensor valid = targets.ne(ignore_index);                                         // [N] bool
    const at::Tensor safe_targets = targets.masked_fill(valid.logical_not(), 0).unsqueeze(1);  // [N, 1]
    const at::Tensor n_valid = valid.sum().to(at::kFloat);  // 0-dim; 0 gives nan, as F.cross_entropy
    // [N, 1]: 1/n_valid or 0 (every row ignored: 0, so zero gradients, as F.cross_entropy's)
    const at::Tensor row_scale = valid.to(at::kFloat).div(n_valid.clamp_min(1)).unsqueeze(1);
    at::Tensor loss_sum = at::zeros({}, f32);
    at::Tensor dh, dw;
    if (want_grad) {
      dh = at::empty_like(h);
      dw = at::zeros({V, h.size(1)}, f32);
    }
    const int64_t chunk = kCrossEntropyChunkRows;
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor hc = h.narrow(0, s, n), tc = safe_targets.narrow(0, s, n);
      at::Tensor lg = matmul_2d(hc, w.t(), Kernels::fast);                 // [n, V]
      at::Tensor logp = at::_log_softmax(lg, 1, /*half_to_float=*/false);  // [n, V] fp32
      lg = at::Tensor();                                                   // (freed: one [n, V] at a time)
      loss_sum.sub_(at::where(valid.narrow(0, s, n), logp.gather(1, tc).squeeze(1), 0.0).sum());
      if (!want_grad) continue;
      logp.exp_();                                                // softmax
      logp.scatter_add_(1, tc, at::full({n, 1}, -1.0, f32));      // - onehot(target)
      const at::Tensor p = logp.mul_(row_scale.narrow(0, s, n));  // d loss / d logits, [n, V]
      dh.narrow(0, s, n).copy_(matmul_2d(p, w, Kernels::fast));   // [n, C]
      dw.add_(matmul_2d(p.t(), hc, Kernels::fast));               // [V, C]
    }
    if (want_grad) ctx->save_for_backward({dh, dw});
    return loss_sum.div(n_valid);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(!saved.empty(), "linear_cross_entropy: backward of a forward that ran without gradients");
    const at::Tensor g = grads[0];
    // loss.backward() seeds 1: the kept gradients as they are (x * 1 == x), no pass over dW.
    if (g.is_cpu() && g.item<float>() == 1.0f) return {saved[0], saved[1], at::Tensor(), at::Tensor(), at::Tensor()};
    return {saved[0] * g, saved[1] * g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The lm_head and the cross entropy in bf16 (autocast, or bf16 operands): the bf16 logits
// h w^T in one GEMM, the one-pass loss kernel over them (cross_entropy_cpu.h), which with
// `want_grad` overwrites them with the unscaled gradient G' in bf16 and gives the rows' factors
// k, then dh = diag(k) (G' w) and dW = G'^T (diag(k) h) as bf16 GEMMs, as autocast's linear
// backward (k on the [N, C] sides: no pass over [N, V] to scale it, dh's product kept in fp32
// before k); the fp32 [N, V] copy and log-probabilities of ATen's loss never exist. Backward
// scales the kept dh, dW by the loss's gradient and returns them in h's and w's dtypes
// (autocast's casts' backward).
struct Bf16LinearCrossEntropyFn : torch::autograd::Function<Bf16LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets,
                            int64_t ignore_index, bool want_grad) {
    NoAutocast no_autocast;
    const at::Tensor hb = h.to(at::kBFloat16), wb = w.to(at::kBFloat16);
    at::Tensor logits = at::mm(hb, wb.t());  // [N, V] bf16
    const at::Tensor cpu_targets = targets.to(at::kCPU);
    const int64_t n_valid = cpu_targets.ne(ignore_index).sum().item<int64_t>();
    const float scale = n_valid > 0 ? 1.0f / static_cast<float>(n_valid) : 0.0f;
    at::Tensor k;  // [N] fp32: the rows' factors of the unscaled gradient G' now in logits
    const double sum = cross_entropy_inplace(logits, cpu_targets, ignore_index, scale, want_grad,
                                             want_grad ? &k : nullptr);
    if (want_grad) {
      ctx->saved_data["h_dtype"] = static_cast<int64_t>(h.scalar_type());
      ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
      const at::Tensor k_col = k.unsqueeze(1);
      const at::Tensor dh = at::mm(logits, wb).to(at::kFloat).mul_(k_col);  // diag(k) (G' w), [N, C] fp32
      const at::Tensor hk = (hb.to(at::kFloat) * k_col).to(at::kBFloat16);  // diag(k) h, [N, C]
      ctx->save_for_backward({dh, at::mm(logits.t(), hk)});                // dW = G'^T diag(k) h, [V, C] bf16
    }
    // The mean over valid rows; none valid: nan, as F.cross_entropy.
    const double mean = n_valid > 0 ? sum / static_cast<double>(n_valid) : std::nan("");
    return at::scalar_tensor(mean, h.options().dtype(at::kFloat));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    const auto saved = ctx->get_saved_variables();
    TORCH_CHECK(!saved.empty(), "linear_cross_entropy: backward of a forward that ran without gradients");
    const at::Tensor g = grads[0];
    const auto h_dtype = static_cast<at::ScalarType>(ctx->saved_data["h_dtype"].toInt());
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    if (g.is_cpu() && g.item<float>() == 1.0f)  // loss.backward(): x.to(fp32) * 1 is x.to(fp32)
      return {saved[0].to(h_dtype), saved[1].to(w_dtype), at::Tensor(), at::Tensor(), at::Tensor()};
    return {(saved[0].to(at::kFloat) * g).to(h_dtype), (saved[1].to(at::kFloat) * g).to(w_dtype), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// Where the bf16 kernel applies: CPU operands computing in bf16 (autocast to bf16, or both bf16).
bool bf16_loss_applies(const at::Tensor& h, const at::Tensor& w) {
  if (!h.device().is_cpu() || !w.device().is_cpu() || !cross_entropy_inplace_available(at::kBFloat16)) return false;
  const auto ac = autocast_dtype(at::kCPU);
  if (ac) return *ac == at::kBFloat16 && at::isFloatingType(h.scalar_type()) && at::isFloatingType(w.scalar_type());
  return h.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16;
}

}  // namespace

bool onednn_linear_available() { return onednn_linear_op() != nullptr; }

// A varying product through oneDNN (its fp32 linear, or ATen's bf16 mm): a row-major left operand
// on rows rounded up (on_rounded_rows); in bf16 a transposed one with its reduction split
// (on_split_reduction); the others as they are.
bool varying_jit(const at::Tensor& a, const at::Tensor& b, Kernels kind, Shape shape) {
  if (shape != Shape::varies) return false;
  if (a.is_contiguous()) return matmul_uses_onednn(a, b, kind) || bf16_mm_jit(a, b, kind);
  return bf16_mm_jit(a, b, kind) && a.t().is_contiguous();
}

at::Tensor matmul_2d(const at::Tensor& a, const at::Tensor& b, Kernels kind, Shape shape) {
  const bool onednn = matmul_uses_onednn(a, b, kind);
  auto product = [&](const at::Tensor& x, const at::Tensor& y) {
    return onednn ? onednn_linear(x, y.t()) : at::mm(x, y);
  };
  if (varying_jit(a, b, kind, shape)) {
    if (a.is_contiguous()) return on_rounded_rows(a, [&](const at::Tensor& x) { return product(x, b); });
    return on_split_reduction(a, b, product);
  }
  return product(a, b);
}

void matmul_2d_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, Kernels kind, Shape shape) {
  // oneDNN's result, or a rounded or split product: copied in
  if (matmul_uses_onednn(a, b, kind) || varying_jit(a, b, kind, shape)) {
    out.copy_(matmul_2d(a, b, kind, shape));
    return;
  }
  at::Tensor o = out;  // a handle to the same view: mm_out writes through it
  at::mm_out(o, a, b);
}

at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& w, Kernels kind) {
  if (kind == Kernels::exact) return at::linear(x, w);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return matmul_2d(x.reshape({-1, x.size(-1)}), w.t(), kind).view(sizes);  // [.., out]
}

at::Tensor linear_dx(const at::Tensor& dy, const at::Tensor& w, at::IntArrayRef x_sizes, Kernels kind) {
  return matmul_2d(dy.reshape({-1, dy.size(-1)}), w, kind).view(x_sizes);  // [.., in]
}

at::Tensor linear_dw(const at::Tensor& dy, const at::Tensor& x, Kernels kind) {
  return matmul_2d(dy.reshape({-1, dy.size(-1)}).t(), x.reshape({-1, x.size(-1)}), kind);  // [out, in]
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, Kernels kind) {
  if (kind == Kernels::exact || !fast_applies(x, w)) return at::linear(x, w);
  return FastLinearFn::apply(x, w);
}

bool attention_upcasts(int64_t T) {
  return T <= kAttentionUpcastMaxT || !dion::math::aten_bf16_matmul_uses_onednn();
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Kernels kind) {
  auto sdpa = [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return at::scaled_dot_product_attention(a, b, c, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  };
  if (kind == Kernels::exact || !q.is_cpu() || !attention_upcasts(q.size(-2))) return sdpa(q, k, v);
  // Whether ATen's call would compute in bf16: under autocast to bf16 with fp32 or bf16 operands
  // (autocast leaves fp64 alone), else with bf16 operands.
  const auto ac = autocast_dtype(q.device().type());
  auto low = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || (ac && t.scalar_type() == at::kFloat);
  };
  const bool bf16 = (!ac || *ac == at::kBFloat16) && low(q) && low(k) && low(v);
  if (!bf16) return sdpa(q, k, v);
  NoAutocast no_autocast;  // the fp32 call stays fp32
  auto up = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };  // autocast's cast, then exact
  return sdpa(up(q), up(k), up(v)).to(at::kBFloat16);
}

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, Kernels kind,
                                int64_t ignore_index) {
  TORCH_CHECK(
      h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1) && targets.dim() == 1 && targets.size(0) == h.size(0),
      "linear_cross_entropy: h [N, C], w [V, C], targets [N]; got h ", h.sizes(), ", w ", w.sizes(), ", targets ",
      targets.sizes());
  const bool want_grad = at::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  // bf16: whole-N bf16 GEMMs around the one-pass loss kernel (measured faster than per-chunk
  // GEMMs, whose dW sums cost more than they save in bf16).
  if (kind == Kernels::fast && bf16_loss_applies(h, w))
    return Bf16LinearCrossEntropyFn::apply(h, w, targets, ignore_index, want_grad);
  if (kind == Kernels::exact || !fast_applies(h, w))
    return at::cross_entropy_loss(linear(h, w, kind).to(at::kFloat), targets, /*weight=*/{}, at::Reduction::Mean,
                                  ignore_index);
  return LinearCrossEntropyFn::apply(h, w, targets, ignore_index, want_grad);
}

}  // namespace dion::train
