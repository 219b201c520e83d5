// bench/device_bench.cpp — the measured rows of scripts/device_check.sh's table, on one device.
//
//   device_bench [--device cuda|cpu] [--quick] [--reps N] [--cuda-kernels off|on|both]
//
// Prints markdown table rows (no header; device_check.sh prints it) on stdout:
//   matmul peak      bf16 [n, n] x [n, n] (n = 8192; 1024 with --quick): TFLOP/s = 2 n^3 / time.
//                    The denominator of every ratio below and of dion-train's MFU.
//   ortho            Newton-Schulz / Polar Express (5 iterations, bf16) on the 160M model's
//                    matrix set, stacked per shape as the optimizer does: [48, 768, 768]
//                    (c_q, c_k, c_v, attn c_proj of 12 layers), [12, 768, 3072] (mlp c_proj),
//                    [12, 3072, 768] (c_fc), on three paths: exact (the reference's operation
//                    order), fast with full products, fast with symmetric products (block rows +
//                    mirror, dion/math/symmetric.h); TFLOP/s counted with the reference's flops
//                    per iteration (X X^T 2 r^2 c, A A 2 r^3, B X 2 r^2 c; r = min, c = max dim),
//                    and that rate / the matmul peak (the goal for Newton-Schulz: >= 0.75).
//   symmetric        the two symmetric products alone on the same set (X X^T and b A + c A A,
//                    bf16): one full product, the library's choice of block rows, and forced
//                    heights of 128, 256 and 512 rows; TFLOP/s counted with the full product's
//                    flops, so a rate above the full product's is the triangle's saving net of
//                    its launches and mirror. (How the CUDA heights were chosen without a GPU:
//                    dion/math/symmetric.h; these rows are what checks that choice.)
//   optimizer step   ms per dion::Optimizer::step() for each matrix algorithm on that set (fp32
//                    parameters, random gradients), after 2 warm-up steps; then the same with
//                    the step captured in a CUDA graph (dion::CudaGraphStep), or why it was
//                    refused (a step that synchronizes with the host cannot be captured).
// --cuda-kernels: the project's own CUDA kernels (dion/math/own_kernels.h) off (the library's
// default: ATen's CUDA ops), on, or both: the rows they change (fast path with symmetric
// products, the symmetric products, the optimizer steps) once each way, the "on" rows marked
// "own kernels". On a CPU the setting changes nothing and only "off" rows are printed.
// --quick divides every dimension by 8 (so that the CPU run finishes in seconds): the table's
// plumbing, not its numbers. What it is not: a test (no thresholds), nor Google Benchmark (one
// timed loop per row, synchronized with the device, is all the table needs).
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dion/cuda/symmetric.h"
#include "dion/dion.h"
#include "dion/math/ortho.h"
#include "dion/math/own_kernels.h"
#include "dion/math/symmetric.h"
#include "dion/optim/cuda_graph.h"

namespace {

struct Args {
  std::string device = "cuda";
  bool quick = false;
  int reps = 10;
  std::string cuda_kernels = "off";
};

void sync(const at::Device& dev) {
  if (dev.is_cuda()) torch::cuda::synchronize();
}

// Mean seconds of `reps` calls after one untimed call.
double time_it(const at::Device& dev, int reps, const std::function<void()>& fn) {
  fn();
  sync(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  sync(dev);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

std::string fmt_ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f ms", seconds * 1e3);
  return buf;
}

double ortho_flops(int64_t batch, int64_t m, int64_t n) {  // 5 iterations, the reference's count
  const double r = static_cast<double>(std::min(m, n)), c = static_cast<double>(std::max(m, n));
  return static_cast<double>(batch) * 5 * (2 * r * r * c + 2 * r * r * r + 2 * r * r * c);
}

// One orthogonalization of G [B, m, n] on a path of the table.
enum class OrthoRun { EXACT, FAST_FULL, FAST_SYMMETRIC };

at::Tensor orthogonalize(const at::Tensor& G, dion::math::OrthoMethod method, OrthoRun run) {
  const bool ns = method == dion::math::OrthoMethod::NEWTON_SCHULZ;
  const double eps = ns ? 1e-7 : 1e-6;
  if (run == OrthoRun::EXACT)
    return ns ? dion::math::newton_schulz(G, eps, at::kBFloat16) : dion::math::polar_express(G, eps, at::kBFloat16);
  return dion::math::orthogonalize_fast(G, method, eps, at::kBFloat16, run == OrthoRun::FAST_SYMMETRIC);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"The measured rows of scripts/device_check.sh's table (markdown rows on stdout).", "device_bench"};
  app.add_option("--device", args.device, "Where to measure")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_flag("--quick", args.quick, "Every dimension / 8: checks the plumbing in seconds, on a CPU too");
  app.add_option("--reps", args.reps, "Timed repetitions per row")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--cuda-kernels", args.cuda_kernels,
                 "The project's own CUDA kernels: off (the default, ATen's ops), on, or both (each row they change "
                 "twice)")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (args.device == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "device_bench: --device cuda but no CUDA device is visible (use --device cpu)\n");
    return 1;
  }
  const at::Device dev(args.device == "cuda" ? at::kCUDA : at::kCPU);
  const int64_t s = args.quick ? 8 : 1;  // dimension divisor
  const auto bf16 = at::TensorOptions().device(dev).dtype(at::kBFloat16);

  // ---- matmul peak
  const int64_t n = 8192 / s;
  const at::Tensor A = at::randn({n, n}, bf16), B = at::randn({n, n}, bf16);
  const double t_mm = time_it(dev, args.reps, [&] { (void)at::matmul(A, B); });
  const double peak = 2.0 * n * n * n / t_mm;
  std::printf("| matmul peak (bf16 %lldx%lld) | %.3g TFLOP/s | 1.00 |\n", static_cast<long long>(n),
              static_cast<long long>(n), peak * 1e-12);

  // ---- orthogonalization on the 160M matrix set
  const std::vector<std::vector<int64_t>> shapes = {
      {48, 768 / s, 768 / s}, {12, 768 / s, 3072 / s}, {12, 3072 / s, 768 / s}};
  struct Path {
    OrthoRun run;
    const char* name;
  };
  // The settings of the own kernels to measure (on a CPU they change nothing: off only).
  std::vector<bool> settings;
  if (args.cuda_kernels != "on" || !dev.is_cuda()) settings.push_back(false);
  if (args.cuda_kernels != "off" && dev.is_cuda()) settings.push_back(true);
  auto mark = [](bool own) { return own ? std::string(", own kernels") : std::string(); };
  for (bool own : settings)
    for (auto method : {dion::math::OrthoMethod::NEWTON_SCHULZ, dion::math::OrthoMethod::POLAR_EXPRESS})
      for (const Path& path : {Path{OrthoRun::EXACT, "exact"}, Path{OrthoRun::FAST_FULL, "fast, full products"},
                               Path{OrthoRun::FAST_SYMMETRIC, "fast, symmetric products"}}) {
        if (own && path.run != OrthoRun::FAST_SYMMETRIC) continue;  // the kernels change this row only
        dion::math::OwnCudaKernelsScope scope(own);
        double flops = 0, seconds = 0;
        for (const auto& shape : shapes) {
          const at::Tensor G = at::randn(shape, bf16);
          flops += ortho_flops(shape[0], shape[1], shape[2]);
          seconds += time_it(dev, args.reps, [&] { (void)orthogonalize(G, method, path.run); });
        }
        std::printf("| %s %s%s, 160M matrix set (%.2f ms) | %.3g TFLOP/s | %.2f |\n",
                    dion::math::to_string(method).c_str(), path.name, mark(own).c_str(), seconds * 1e3,
                    flops / seconds * 1e-12, flops / seconds / peak);
      }

  // ---- the symmetric products alone: X X^T [B, r, r] of the iterate and b A + c A A
  // (block_rows: -1 one full product, 0 the library's choice, else forced).
  for (bool own : settings)
    for (int64_t block_rows : {int64_t{-1}, int64_t{0}, 128 / s, 256 / s, 512 / s}) {
      if (own && block_rows < 0) continue;  // one full product: cuBLAS either way
      dion::math::OwnCudaKernelsScope scope(own);
      double flops = 0, seconds = 0;
      for (const auto& shape : shapes) {
        const int64_t batch = shape[0], r = std::min(shape[1], shape[2]), c = std::max(shape[1], shape[2]);
        const at::Tensor X = at::randn({batch, r, c}, bf16) / std::sqrt(static_cast<double>(c));  // [B, r, c]
        const at::Tensor A = at::matmul(X, X.mT());                                               // [B, r, r]
        at::Tensor P = at::empty({batch, r, r}, bf16);
        flops += 2.0 * batch * r * r * c + 2.0 * batch * r * r * r;
        seconds += time_it(dev, args.reps, [&] {
          if (block_rows > 0) {
            dion::math::symmetric_product_block_rows_out(P, X, X.mT(), at::Tensor(), 0.0, 1.0, block_rows);
            dion::math::symmetric_product_block_rows_out(P, A, A, A, -6.9, 2.9, block_rows);
          } else {
            dion::math::symmetric_product_out(P, X, X.mT(), at::Tensor(), 0.0, 1.0, block_rows == 0);
            dion::math::symmetric_product_out(P, A, A, A, -6.9, 2.9, block_rows == 0);
          }
        });
      }
      std::string how =
          block_rows < 0 ? std::string("one full product") : "block rows of " + std::to_string(block_rows);
      if (block_rows == 0) {  // the heights symmetric_product_out picks per shape (CPU: its own thresholds)
        how = "the library's choice (";
        for (const auto& shape : shapes) {
          const int64_t r = std::min(shape[1], shape[2]);
          const int64_t rows =
              !dev.is_cuda() ? -1
              : !own         ? 0
                             : dion::math::cuda_symmetric_block_rows(
                                   shape[0], r, dion::cuda::multiprocessor_count(dev.index() < 0 ? 0 : dev.index()));
          how += (&shape == &shapes.front() ? "" : ", ") + (rows < 0    ? std::string("CPU rule")
                                                            : rows == 0 ? std::string("full")
                                                                        : std::to_string(rows) + " rows");
        }
        how += ")";
      }
      std::printf("| symmetric X X^T + b A + c A A, 160M matrix set, %s%s (%.2f ms) | %.3g TFLOP/s | %.2f |\n",
                  how.c_str(), mark(own).c_str(), seconds * 1e3, flops / seconds * 1e-12, flops / seconds / peak);
    }

  // ---- optimizer step per algorithm
  std::vector<std::vector<int64_t>> params;
  for (int layer = 0; layer < 12; ++layer) {
    for (int k = 0; k < 4; ++k) params.push_back({768 / s, 768 / s});
    params.push_back({3072 / s, 768 / s});
    params.push_back({768 / s, 3072 / s});
  }
  for (bool own : settings)
    for (const char* algo : {"muon", "normuon", "dion2", "nordion2", "dion"}) {
      dion::math::OwnCudaKernelsScope scope(own);
      std::vector<at::Tensor> X;
      for (const auto& shape : params) {
        at::Tensor p = at::randn(shape, at::TensorOptions().device(dev)) * 0.02;
        p.mutable_grad() = at::randn(shape, at::TensorOptions().device(dev));
        X.push_back(p);
      }
      dion::Optimizer opt(X, dion::Options(0.02).algorithm(algo));
      opt.step();  // state creation; time_it adds one more untimed step
      const double t = time_it(dev, args.reps, [&] { opt.step(); });
      std::string graphed = "n/a (CPU)";
      if (dev.is_cuda()) {
        try {  // the same optimizer, captured after its warm-up steps above
          dion::CudaGraphStep g(opt, /*warmup_steps=*/0);
          g.step();  // capture + one replay
          graphed = fmt_ms(time_it(dev, args.reps, [&] { g.step(); }));
        } catch (const std::exception& e) {
          graphed = std::string("refused: ") + std::string(e.what()).substr(0, 80);
        }
      }
      std::printf("| optimizer step %s%s, 160M matrix set | %.2f ms | graphed: %s |\n", algo, mark(own).c_str(),
                  t * 1e3, graphed.c_str());
    }
  return 0;
}
