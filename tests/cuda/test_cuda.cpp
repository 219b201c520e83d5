// GPU checks: skipped (with a reason) on machines without a CUDA device, such as CI.
//
// What they pin, on a GPU:
// - each fused kernel (dion/cuda/fused.h) equals its ATen composition, run on the same GPU, to
//   within 1 ulp of the result dtype (they are built to be bit-identical: same roundings, no FMA
//   contraction); the hyperparameters are chosen so that a kernel that does nothing, or only
//   half its work, is off by far more than 1 ulp;
// - the symmetric products (dion/math/symmetric.h) on CUDA: block rows of the lower triangle
//   plus the mirror kernel equal one full at::matmul within the bound of
//   tests/support/product_bounds.h (fp32 accumulation, one rounding each), are exactly
//   symmetric, and write every entry; the mirror kernel equals at::tril + transpose bit for
//   bit; the fast orthogonalizer runs on the GPU with them and agrees with its full-product run;
// - the optimizers run unchanged on CUDA tensors and their one-step UPDATE (X_after - X_before)
//   agrees with the CPU run's at a tolerance derived below (comparing X itself would let a GPU
//   step that does nothing pass: the update is ~lr = 2e-2 of X);
// - dion::CudaGraphStep: replayed steps equal eager steps, under an lr and weight-decay schedule
//   too (lr / weight decay read from device tensors, dion/math/rates.h), and what a replay
//   cannot do is refused.
// - the project's own kernels are opt-in (dion/math/own_kernels.h): the tests that check them turn
//   them on (OwnCudaKernelsScope), the math-layer and optimizer tests run with them off (ATen's
//   CUDA ops, the default) and on, and a default optimizer step launches none of them. The
//   dispatch decision itself is checked everywhere, on tensors that only describe CUDA tensors
//   (CudaDispatch.*: no device needed).
// scripts/device_check.sh runs this binary on the lent GPU machine. (The NCCL path of
// dion::comm::Group needs two GPUs; the lent machine has one, so it is compiled here but not run
// anywhere yet.)
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dion/cuda/fused.h"
#include "dion/cuda/symmetric.h"
#include "dion/dion.h"
#include "dion/math/dion.h"
#include "dion/math/dion2.h"
#include "dion/math/muon.h"
#include "dion/math/ortho.h"
#include "dion/math/own_kernels.h"
#include "dion/math/symmetric.h"
#include "dion/optim/cuda_graph.h"
#include "fake_distribution.h"
#include "matrices.h"
#include "product_bounds.h"

namespace {

#define SKIP_WITHOUT_CUDA()                                                              \
  if (!at::hasCUDA() || !dion::cuda::available()) {                                      \
    GTEST_SKIP() << "no CUDA device (or built without CUDA kernels): GPU check skipped"; \
  }

// Largest |actual - expected| in units of the result dtype's ulp at |expected| (fp32: 2^-23
// relative, bf16: 2^-7; the smallest normal's ulp near zero).
double max_ulps(const at::Tensor& actual, const at::Tensor& expected) {
  const bool b = expected.scalar_type() == at::kBFloat16;
  const double rel = b ? std::ldexp(1.0, -7) : std::ldexp(1.0, -23);
  const at::Tensor e = expected.to(at::kDouble), a = actual.to(at::kDouble);
  const at::Tensor ulp = at::clamp_min(at::exp2(at::floor(at::log2(e.abs()))) * rel, 1e-38);
  return ((a - e).abs() / ulp).max().item<double>();
}

const std::vector<std::pair<at::ScalarType, at::ScalarType>> kDtypePairs = {
    {at::kFloat, at::kFloat}, {at::kFloat, at::kBFloat16}, {at::kBFloat16, at::kFloat}, {at::kBFloat16, at::kBFloat16}};

at::Tensor cuda_randn(std::vector<int64_t> shape, at::ScalarType dtype) {
  return at::randn(shape, at::TensorOptions().device(at::kCUDA).dtype(dtype));
}

// X.mul_(decay); X.add_(U * neg_lr): the ATen composition of decay_and_update_ (muon_post).
TEST(Cuda, FusedDecayAndUpdateEqualsItsAtenComposition) {
  SKIP_WITHOUT_CUDA();
  dion::math::OwnCudaKernelsScope own(true);  // the kernels under test (off by default)
  const float decay = 0.9f, neg_lr = -0.5f;   // a no-op kernel is off by ~0.1 |X| + 0.5 |U|
  for (auto [xt, ut] : kDtypePairs) {
    SCOPED_TRACE(std::string(c10::toString(xt)) + " X, " + c10::toString(ut) + " U");
    at::Tensor X = cuda_randn({257, 129}, xt), U = cuda_randn({257, 129}, ut);
    at::Tensor expected = X.clone();
    expected.mul_(at::scalar_tensor(decay, at::kFloat));
    expected.sub_(U * at::scalar_tensor(-neg_lr, at::kFloat));
    dion::cuda::decay_and_update_(X, U, decay, neg_lr);
    EXPECT_LE(max_ulps(X, expected), 1.0);
  }
}

// g = G.to(M's dtype); M.mul_(mu).add_(g); U = nesterov ? M * mu + g : M, in U's dtype (muon_pre).
TEST(Cuda, FusedMomentumEqualsItsAtenComposition) {
  SKIP_WITHOUT_CUDA();
  dion::math::OwnCudaKernelsScope own(true);  // the kernel under test (off by default)
  const float mu = 0.5f;                      // a no-op kernel is off by ~0.5 |M| + |G|
  for (bool nesterov : {false, true})
    for (auto [mt, gt] : kDtypePairs)
      for (at::ScalarType ut : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(std::string(c10::toString(mt)) + " M, " + c10::toString(gt) + " G, " + c10::toString(ut) +
                     " U, nesterov " + std::to_string(nesterov));
        at::Tensor M = cuda_randn({129, 257}, mt), G = cuda_randn({129, 257}, gt);
        at::Tensor M_ref = M.clone();
        const at::Tensor g = G.to(mt), mu_t = at::scalar_tensor(mu, at::kFloat);
        M_ref.mul_(mu_t).add_(g);
        const at::Tensor U_ref = (nesterov ? M_ref * mu_t + g : M_ref).to(ut);
        at::Tensor U = at::empty({129, 257}, M.options().dtype(ut));
        dion::cuda::momentum_(M, G, U, mu, nesterov);
        EXPECT_LE(max_ulps(M, M_ref), 1.0);
        EXPECT_LE(max_ulps(U, U_ref), 1.0);
      }
}

// The math layer takes the kernels for contiguous CUDA tensors and gives what its CPU path gives.
// With the own kernels off (the default) the same functions run ATen's CUDA ops and launch none.
TEST(Cuda, MuonPreAndPostOnCudaMatchTheirCpuPath) {
  SKIP_WITHOUT_CUDA();
  for (bool own : {false, true}) {
    SCOPED_TRACE(own ? "own kernels on" : "own kernels off (ATen)");
    dion::math::OwnCudaKernelsScope scope(own);
    at::manual_seed(1);
    at::Tensor X = at::randn({64, 96}), M = at::randn({64, 96}), G = at::randn({64, 96});
    at::Tensor Xg = X.cuda(), Mg = M.cuda(), Gg = G.cuda();
    EXPECT_TRUE(dion::cuda::fusable(Xg, Gg));
    EXPECT_EQ(dion::math::own_fused_kernel(Xg, Gg), own);
    const int64_t launches = dion::cuda::own_kernel_launches();
    const auto U = dion::math::muon_pre({G}, {M}, 0.95f, true, at::kBFloat16);
    const auto Ug = dion::math::muon_pre({Gg}, {Mg}, 0.95f, true, at::kBFloat16);
    // CPU and GPU round alike here (fp32 element-wise ops, one bf16 cast): 1 ulp.
    EXPECT_LE(max_ulps(Mg.cpu(), M), 1.0);
    EXPECT_LE(max_ulps(Ug[0].cpu(), U[0]), 1.0);
    dion::math::muon_post({X}, {U[0]}, 0.02f, 0.5f, 0.1f, false);
    dion::math::muon_post({Xg}, {Ug[0]}, 0.02f, 0.5f, 0.1f, false);
    EXPECT_LE(max_ulps(Xg.cpu(), X), 1.0);
    EXPECT_EQ(dion::cuda::own_kernel_launches() - launches, own ? 2 : 0);
  }
}

// Dion2's masked post step (error-feedback decay of the selected rows, decay and update of X)
// takes the fused decay+update kernel on the GPU and gives what its CPU path gives.
TEST(Cuda, Dion2PostMaskedOnCudaMatchesItsCpuPath) {
  SKIP_WITHOUT_CUDA();
  for (bool own : {false, true}) {
    SCOPED_TRACE(own ? "own kernels on" : "own kernels off (ATen)");
    dion::math::OwnCudaKernelsScope scope(own);
    at::manual_seed(2);
    at::Tensor X = at::randn({48, 80}), M = at::randn({48, 80});
    at::Tensor U = at::randn({48, 80}).to(at::kBFloat16);
    U.narrow(0, 0, 24).zero_();  // half the rows not selected
    at::Tensor Xg = X.cuda(), Mg = M.cuda(), Ug = U.cuda();
    const int64_t launches = dion::cuda::own_kernel_launches();
    dion::math::dion2_post_masked({X}, {M}, {U}, 0.02f, 0.5f, 0.1f, 0.9f, -2);
    dion::math::dion2_post_masked({Xg}, {Mg}, {Ug}, 0.02f, 0.5f, 0.1f, 0.9f, -2);
    EXPECT_LE(max_ulps(Xg.cpu(), X), 1.0);
    EXPECT_LE(max_ulps(Mg.cpu(), M), 1.0);
    EXPECT_EQ(dion::cuda::own_kernel_launches() - launches, own ? 1 : 0);
  }
}

// One step of each algorithm on CPU and on the GPU from the same X, G: the updates must agree.
//
// Tolerance, derived. Both devices orthogonalize in bf16 (5 Newton-Schulz / Polar Express
// iterations; fp32 accumulation in the matmuls, bf16 between them), in a different order of
// accumulation, so their results differ by bf16 rounding, not by an algorithmic difference.
// bf16 keeps 8 significant bits: unit roundoff u = 2^-8 = 3.9e-3. Each iteration rounds its
// three products (A = X X^T, B = b A + c A A, B X) to bf16 and the iteration is contractive
// around the orthogonal polar factor, so the two runs' rounding differences do not grow
// geometrically; after 5 iterations they stay within about 5 x 3 roundings of u relative to
// the largest entry of O: 15 u ~ 6e-2 in the worst case, ~sqrt(15) u ~ 1.5e-2 typically. The
// update is -adjusted_lr * O - lr * wd * X; the fp32 scaling adds nothing at this scale. Hence:
// max |dX_gpu - dX_cpu| <= 6e-2 max |dX_cpu|. A GPU step that does nothing is off by 1.0 (the
// whole update), a step of the wrong sign by 2.0, one with lr off by 10% by 0.1: each fails.
// (Legacy Dion is left out of the element-wise check: its randomized QR draws its sketch from
// a generator of the tensors' device, so CPU and GPU orthonormalize different random sketches;
// its update's Frobenius norm, set by the rms/spectral scaling of an orthonormal basis, is
// compared instead, within the same 6e-2.)
TEST(Cuda, OptimizerUpdatesMatchCpu) {
  SKIP_WITHOUT_CUDA();
  constexpr double kTol = 6e-2;
  for (bool own : {false, true})
    for (const char* algo : {"muon", "normuon", "dion2", "nordion2", "dion"}) {
      SCOPED_TRACE(std::string(algo) + (own ? ", own kernels on" : ", own kernels off (ATen)"));
      dion::math::OwnCudaKernelsScope scope(own);
      at::manual_seed(0);
      const at::Tensor w = at::randn({64, 128}), g = at::randn({64, 128});
      at::Tensor wc = w.clone(), wg = w.to(at::kCUDA);
      wc.mutable_grad() = g.clone();
      wg.mutable_grad() = g.to(at::kCUDA);
      dion::Optimizer cpu({wc}, dion::Options(0.02).algorithm(algo));
      dion::Optimizer gpu({wg}, dion::Options(0.02).algorithm(algo));
      cpu.step();
      gpu.step();
      const at::Tensor dc = (wc - w).to(at::kDouble), dg = (wg.cpu() - w).to(at::kDouble);
      const double scale = dc.abs().max().item<double>();
      ASSERT_GT(scale, 0.0) << "the CPU step did not change the parameter";
      if (std::string(algo) == "dion") {
        const double ratio = dg.norm().item<double>() / dc.norm().item<double>();
        EXPECT_NEAR(ratio, 1.0, kTol) << "update norms: GPU / CPU";
      } else {
        EXPECT_LE((dg - dc).abs().max().item<double>() / scale, kTol);
      }
    }
}

}  // namespace

namespace {

// Legacy Dion's FSDP x TP path draws its sketch from a seeded generator; on CUDA tensors that
// generator must be a CUDA one (the CPU one it used to pass made normal_ throw).
TEST(Cuda, DionSketchGeneratorOnTheTensorsDevice) {
  SKIP_WITHOUT_CUDA();
  const at::Device dev(at::kCUDA, 0);
  at::Generator a = dion::math::dion_sketch_generator(dev, 7), b = dion::math::dion_sketch_generator(dev, 7);
  EXPECT_EQ(a.device().type(), at::kCUDA);
  at::Tensor P = at::randn({2, 300, 8}, at::TensorOptions().device(dev));
  at::Tensor Pa = dion::math::dion_orthonormalize(P, 1.25f, a), Pb = dion::math::dion_orthonormalize(P, 1.25f, b);
  EXPECT_TRUE(at::equal(Pa, Pb));
  at::Tensor gram = at::matmul(Pa.mT(), Pa).cpu();
  EXPECT_LE((gram - at::eye(8).expand_as(gram)).abs().max().item<double>(), 1e-4);
}

}  // namespace

// ---------------------------------------------------------------------------- symmetric products

namespace {

// cuBLAS in the precision the bound of product_bounds.h assumes: fp32 accumulation without TF32
// and without bf16 reductions of split-K partial sums (torch's default allows those; each adds
// a bf16 rounding the bound does not count). Restored on exit.
class ExactCublas {
 public:
  ExactCublas() : tf32_(at::globalContext().allowTF32CuBLAS()), bf16_(at::globalContext().allowBF16ReductionCuBLAS()) {
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowBF16ReductionCuBLAS(false, true);
  }
  ~ExactCublas() {
    at::globalContext().setAllowTF32CuBLAS(tf32_);
    at::globalContext().setAllowBF16ReductionCuBLAS(
        bf16_ == at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK,
        bf16_ != at::CuBLASReductionOption::DisallowReducedPrecisionDisallowSplitK);
  }
  ExactCublas(const ExactCublas&) = delete;
  ExactCublas& operator=(const ExactCublas&) = delete;

 private:
  bool tf32_;
  at::CuBLASReductionOption bf16_;
};

// The mirror kernel copies bits: every dtype size, odd sizes (partial 32 x 32 tiles), a batch
// past the grid's z limit (65535: the kernel loops over the rest), from_row against the CPU
// loop. A kernel that did nothing leaves the upper triangle random (not equal to the lower one).
TEST(Cuda, MirrorKernelEqualsTrilTranspose) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(11);
  std::optional<dion::math::OwnCudaKernelsScope> own(std::in_place, true);  // the kernel under test
  struct Case {
    int64_t batch, m;
  };
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat, at::kDouble})
    for (const Case& c : {Case{3, 67}, Case{1, 1}, Case{2, 32}, Case{1, 300}, Case{65537, 3}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " B " + std::to_string(c.batch) + " m " + std::to_string(c.m));
      const at::Tensor A = cuda_randn({c.batch, c.m, c.m}, dt);
      at::Tensor P = A.clone();
      dion::cuda::mirror_lower_to_upper_(P);
      EXPECT_TRUE(at::equal(P.tril(), A.tril()));          // lower triangle and diagonal kept
      EXPECT_TRUE(at::equal(P.triu(1), A.tril(-1).mT()));  // upper = lower^T, bit for bit
    }
  const at::Tensor A = cuda_randn({2, 100, 100}, at::kFloat);
  at::Tensor P = A.clone(), expected = A.cpu();
  dion::cuda::mirror_lower_to_upper_(P, 40);
  dion::math::mirror_lower_to_upper(expected, 40);  // the CPU loop
  EXPECT_TRUE(at::equal(P.cpu(), expected));
  EXPECT_FALSE(at::equal(P.cpu(), A.cpu()));
  own.reset();
  // The math layer's mirror on CUDA: the kernel when turned on, ATen's ops by default; both equal.
  for (bool on : {false, true}) {
    dion::math::OwnCudaKernelsScope scope(on);
    at::Tensor Q = A.clone();
    const int64_t launches = dion::cuda::own_kernel_launches();
    dion::math::mirror_lower_to_upper(Q, 40);
    EXPECT_TRUE(at::equal(Q.cpu(), expected)) << "own kernels " << on;
    EXPECT_EQ(dion::cuda::own_kernel_launches() - launches, on ? 1 : 0);
  }
  at::Tensor strided = cuda_randn({2, 8, 16}, at::kFloat).slice(2, 0, 8);
  EXPECT_THROW(dion::cuda::mirror_lower_to_upper_(strided), c10::Error);
}

// X X^T and b A + c A A by block rows on the GPU against one full at::matmul / at::baddbmm on
// the GPU. Forced heights (odd sizes, short merged last blocks, batches) and the heights the
// library picks itself for the 160M model's shapes (asserted to be block rows, not the full
// product). P starts as NaN, so an entry no block row or mirror writes fails; inputs with row
// offsets make every entry of the order of the largest, so a misplaced block fails the bound.
TEST(Cuda, SymmetricProductsEqualTheFullProduct) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(12);
  ExactCublas exact;
  dion::math::OwnCudaKernelsScope own(true);  // the block rows and the mirror kernel
  const int64_t sms = dion::cuda::multiprocessor_count(0);
  ASSERT_GT(sms, 0);
  struct Case {
    int64_t batch, m, k, rows;  // rows 0: the library's own choice (must be block rows)
  };
  const std::vector<Case> cases = {
      {3, 517, 300, 128}, {2, 1030, 1030, 256}, {5, 263, 700, 100}, {48, 768, 768, 0}, {12, 768, 3072, 0}};
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " B " + std::to_string(c.batch) + " m " + std::to_string(c.m) +
                   " k " + std::to_string(c.k) + " rows " + std::to_string(c.rows));
      if (c.rows == 0) {
        ASSERT_GT(dion::math::cuda_symmetric_block_rows(c.batch, c.m, sms), 0);
      }
      const at::Tensor X =
          dion::testing::offset_rows({c.batch, c.m, c.k}, at::TensorOptions().device(at::kCUDA).dtype(dt));
      auto run = [&](const at::Tensor& P, const at::Tensor& M1, const at::Tensor& M2, const at::Tensor& S, double beta,
                     double alpha) {
        P.fill_(NAN);
        if (c.rows > 0)
          dion::math::symmetric_product_block_rows_out(P, M1, M2, S, beta, alpha, c.rows);
        else
          dion::math::symmetric_product_out(P, M1, M2, S, beta, alpha, /*tiled=*/true);
      };
      at::Tensor P = at::empty({c.batch, c.m, c.m}, X.options());
      run(P, X, X.mT(), at::Tensor(), 0.0, 1.0);
      const at::Tensor Q = at::matmul(X, X.mT());
      EXPECT_LE(dion::testing::max_abs_diff(P, Q), dion::testing::product_difference_bound(X, X.mT(), 1.0, {}, 0.0, Q))
          << "gram";
      EXPECT_TRUE(at::equal(P, P.mT())) << "gram";
      const at::Tensor S = (Q / static_cast<double>(c.k)).contiguous();  // symmetric
      run(P, S, S, S, -2.5, 0.75);
      const at::Tensor R = at::baddbmm(S, S, S, -2.5, 0.75);
      EXPECT_LE(dion::testing::max_abs_diff(P, R), dion::testing::product_difference_bound(S, S, 0.75, S, -2.5, R))
          << "b S + c S S";
      EXPECT_TRUE(at::equal(P, P.mT())) << "b S + c S S";
    }
}

// The fast orthogonalizer on CUDA tensors: it stays on the GPU (its workspaces are the input's
// device), its symmetric products agree with its full-product run, and its singular values are
// in Polar Express's band [0.83, 1.17] (tests/math/test_ortho.cpp derives it). Tolerance between the
// two runs: both are the same bf16 iteration whose products differ by rounding only; as in
// OptimizerUpdatesMatchCpu below, 5 iterations x 3 roundings of u = 2^-8 relative: 6e-2 in the
// worst case, relative Frobenius. A result that skipped the iteration (the normalized input) is
// off by O(1), and outside the band.
TEST(Cuda, FastOrthogonalizationWithSymmetricProducts) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(13);
  dion::math::OwnCudaKernelsScope own(true);  // symmetric products by block rows + mirror kernel
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{48, 768, 768}, {12, 768, 3072}, {12, 3072, 768}}) {
    SCOPED_TRACE(c10::str(at::IntArrayRef(shape)));
    const at::Tensor G = dion::testing::conditioned(shape, 0.1).to(at::kCUDA);  // condition 10, as there
    const at::Tensor U =
        dion::math::orthogonalize_fast(G, dion::math::OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16, true);
    const at::Tensor F =
        dion::math::orthogonalize_fast(G, dion::math::OrthoMethod::POLAR_EXPRESS, 1e-6, at::kBFloat16, false);
    ASSERT_TRUE(U.is_cuda());
    const double rel = ((U.to(at::kDouble) - F.to(at::kDouble)).norm() / F.to(at::kDouble).norm()).item<double>();
    EXPECT_LE(rel, 6e-2);
    const at::Tensor sv = dion::testing::svdvals(U);  // float64, on the GPU
    EXPECT_GE(sv.min().item<double>(), 0.83);
    EXPECT_LE(sv.max().item<double>(), 1.17);
  }
}

}  // namespace

// ---------------------------------------------------------------------------- CUDA-graph step

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Runs everywhere: a CPU parameter is refused up front with its group, index and device.
TEST(CudaGraphStep, RefusesParametersNotOnOneCudaDevice) {
  at::Tensor w = at::randn({8, 8});
  dion::Optimizer opt({w}, dion::Options(0.02).algorithm("muon"));
  EXPECT_NE(error_of([&] { dion::CudaGraphStep g(opt); }).find("param group 0, parameter 0 of shape [8, 8] is on cpu"),
            std::string::npos);
}

// Runs everywhere: an optimizer distributed over several processes is refused before anything is
// captured (a capture failing on one rank would leave the others in a collective), and before
// the device check, which would name the CPU parameter instead.
TEST(CudaGraphStep, RefusesADistributedOptimizer) {
  dion::testing::FakeWorld world(2);
  std::vector<std::string> errors(2);
  world.run([&](int r) {
    at::Tensor w = at::randn({8, 8});
    dion::Optimizer opt({w}, dion::Options(0.02).algorithm("muon"), {}, world.distribution(r));
    errors[static_cast<size_t>(r)] = error_of([&] { dion::CudaGraphStep g(opt); });
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("CudaGraphStep: the optimizer is distributed over 2 processes"), std::string::npos) << e;
}

// Eager steps and graphed steps (1 warm-up, capture, replays) from the same start and the same
// gradients, written into the same gradient tensors, give the same parameters: the replay runs the
// captured kernels on the new data. Tolerance 1e-6 relative: the kernels are the same; cuBLAS may
// pick another algorithm inside a capture (its workspace differs), which changes the bf16
// orthogonalization's accumulation order only. A replay that did nothing would leave the
// parameters 5 steps behind (relative difference ~ 5 x lr = 0.1), and the test checks they moved.
TEST(Cuda, GraphedStepsEqualEagerSteps) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(3);
  const at::Tensor w0 = at::randn({64, 96}, at::TensorOptions().device(at::kCUDA));
  at::Tensor we = w0.clone(), wg = w0.clone();
  we.mutable_grad() = at::zeros_like(w0);
  wg.mutable_grad() = at::zeros_like(w0);
  dion::Optimizer eager({we}, dion::Options(0.02).algorithm("muon"));
  dion::Optimizer graphed_opt({wg}, dion::Options(0.02).algorithm("muon"));
  dion::CudaGraphStep graphed(graphed_opt);
  for (int t = 0; t < 6; ++t) {
    const at::Tensor g = at::randn_like(w0);
    we.mutable_grad().copy_(g);
    wg.mutable_grad().copy_(g);
    eager.step();
    graphed.step();
  }
  EXPECT_TRUE(graphed.captured());
  EXPECT_EQ(graphed.replays(), 5);
  const double scale = (we - w0).abs().max().item<double>();
  ASSERT_GT(scale, 0.0);
  EXPECT_LE((wg - we).abs().max().item<double>() / scale, 1e-6);
  EXPECT_EQ(static_cast<dion::Options&>(graphed_opt.param_groups()[0].options()).step(), 6);
}

TEST(Cuda, GraphStepRefusesWhatItCannotReplay) {
  SKIP_WITHOUT_CUDA();
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor a = at::randn({32, 32}, cuda), b = at::randn({32, 32}, cuda);
  a.mutable_grad() = at::randn({32, 32}, cuda);  // b has none
  dion::Optimizer opt({a, b}, dion::Options(0.02).algorithm("muon"));
  dion::CudaGraphStep graphed(opt, /*warmup_steps=*/0);
  EXPECT_NE(error_of([&] { graphed.step(); }).find("parameter 1 of shape [32, 32] has no gradient"), std::string::npos);
  b.mutable_grad() = at::randn({32, 32}, cuda);
  graphed.step();  // captured
  ASSERT_TRUE(graphed.captured());
  opt.param_groups()[0].options().set_lr(0.01);  // read on the device: a replay follows it
  graphed.step();
  opt.options(0).mu(0.5);  // read on the host: the graph holds 0.95
  EXPECT_NE(error_of([&] { graphed.step(); }).find("a hyperparameter changed"), std::string::npos);
  graphed.reset();
  graphed.step();  // captured again with the new mu
  b.mutable_grad() = at::randn({32, 32}, cuda);
  EXPECT_NE(error_of([&] { graphed.step(); }).find("parameter 1's gradient is not the tensor"), std::string::npos);
  graphed.reset();
  graphed.step();
  at::Tensor c = at::randn({16, 16}, cuda);
  c.mutable_grad() = at::randn({16, 16}, cuda);
  opt.add_param_group(dion::ParamGroup{{c}});
  EXPECT_NE(error_of([&] { graphed.step(); }).find("parameter set changed"), std::string::npos);
}

}  // namespace

namespace {

// An lr and weight-decay schedule under replay (device scalars, dion/math/rates.h): graphed steps
// follow it as eager steps do, with the own kernels off and on. Groups: muon on fp32 and bf16
// matrices (with the kernels on: the fused kernel reading the values by pointer), lion and adamw (lr from the tensor). The eager
// optimizer reads host values: the two forms are bit-identical on the device as on CPU, but
// cuBLAS may pick another algorithm inside a capture, so the tolerance is the one of
// GraphedStepsEqualEagerSteps: 1e-6 of the update (bf16 parameters: 1 bf16 ulp of the largest
// entry, 2^-8 relative). A replay that kept the captured lr (0.02, while the schedule goes down
// to 0.004) would be off by ~half the update, far outside it.
TEST(Cuda, GraphReplayFollowsAnLrAndWeightDecaySchedule) {
  SKIP_WITHOUT_CUDA();
  for (bool own : {false, true}) {  // ATen's ops (default), then the fused kernel by pointer
    SCOPED_TRACE(own ? "own kernels on" : "own kernels off (ATen)");
    dion::math::OwnCudaKernelsScope scope(own);
    at::manual_seed(4);
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    const std::vector<at::Tensor> start = {at::randn({64, 96}, cuda), at::randn({64, 96}, cuda).to(at::kBFloat16),
                                           at::randn({96}, cuda), at::randn({32, 96}, cuda)};
    auto make = [&](std::vector<at::Tensor>& p) {
      p.clear();
      for (const at::Tensor& t : start) {
        p.push_back(t.clone());
        p.back().mutable_grad() = at::zeros_like(t);
      }
      return std::make_unique<dion::Optimizer>(
          std::vector<dion::ParamGroup>{{{p[0]}},
                                        {{p[1]}},
                                        {{p[2]}, {.algorithm = "adamw", .lr = 0.003}},
                                        {{p[3]}, {.algorithm = "lion", .lr = 0.001}}},
          dion::Options(0.02).algorithm("muon").weight_decay(0.1));
    };
    std::vector<at::Tensor> pe, pg;
    auto eager = make(pe), graphed_opt = make(pg);
    dion::CudaGraphStep graphed(*graphed_opt);
    const double base[] = {0.02, 0.02, 0.003, 0.001};
    for (int t = 0; t < 8; ++t) {
      for (size_t i = 0; i < start.size(); ++i) {
        const at::Tensor g = at::randn_like(start[i]);
        pe[i].mutable_grad().copy_(g);
        pg[i].mutable_grad().copy_(g);
      }
      for (dion::Optimizer* o : {eager.get(), graphed_opt.get()})
        for (size_t g = 0; g < 4; ++g) {
          o->options(g).lr(base[g] * (1.0 - 0.1 * t));  // a linear decay
          if (g != 2) o->options(g).weight_decay(0.1 + 0.02 * t);
        }
      eager->step();
      graphed.step();
    }
    ASSERT_TRUE(graphed.captured());
    EXPECT_EQ(graphed.replays(), 7);
    for (size_t i = 0; i < start.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      const at::Tensor de = (pe[i] - start[i]).to(at::kDouble), dg = (pg[i] - start[i]).to(at::kDouble);
      const double scale = de.abs().max().item<double>();
      ASSERT_GT(scale, 0.0);
      const double tol = start[i].scalar_type() == at::kBFloat16
                             ? std::ldexp(1.0, -8) * pe[i].abs().max().item<double>()
                             : 1e-6 * scale;
      EXPECT_LE((dg - de).abs().max().item<double>(), tol);
    }
    // AdamW's weight decay is read on the host (torch's fused kernel): a change is refused.
    graphed_opt->options(2).weight_decay(0.5);
    EXPECT_NE(error_of([&] { graphed.step(); }).find("param group 2 (adamw): weight_decay changed"), std::string::npos);
  }
}

}  // namespace

// ---------------------------------------------------------------------------- own kernels: opt-in

namespace {

// A tensor that only describes a CUDA tensor (device, dtype, shape, strides) over a host buffer
// nothing reads: the dispatch decisions read metadata only, so a machine without a GPU can ask
// them what a CUDA tensor would get. Made without touching a device.
at::Tensor described_cuda(at::IntArrayRef shape, at::ScalarType dtype) {
  static std::vector<double> nothing(1);  // never read; a non-null address for the storage
  const at::Device cuda(at::kCUDA, 0);
  return at::for_blob(nothing.data(), shape)
      .options(at::TensorOptions().dtype(dtype).device(cuda))
      .target_device(cuda)
      .make_tensor();
}

// Restores the process-wide setting however a test ends.
struct ProcessWide {
  explicit ProcessWide(bool on) { dion::math::set_own_cuda_kernels(on); }
  ~ProcessWide() { dion::math::set_own_cuda_kernels(false); }
};

// The default on CUDA tensors is ATen's ops: no decision picks an own kernel until a setting turns
// them on. Runs everywhere; in a build with CUDA kernels (this repository's CPU CI compiles them)
// the "on" cases pick them, so the test fails if the default flips or the switch stops working.
TEST(CudaDispatch, OwnKernelsAreOffByDefaultAndASettingTurnsThemOn) {
  const at::Tensor X = described_cuda({64, 96}, at::kFloat), U = described_cuda({64, 96}, at::kBFloat16);
  const at::Tensor P = described_cuda({48, 768, 768}, at::kBFloat16);
  ASSERT_TRUE(X.is_cuda() && P.is_cuda());
  ASSERT_EQ(dion::cuda::fusable(X, U), dion::cuda::available());  // the kernels could take them
  EXPECT_FALSE(dion::math::use_own_cuda_kernels());
  EXPECT_FALSE(dion::math::own_fused_kernel(X, U));
  EXPECT_FALSE(dion::math::own_mirror_kernel(P));
  const bool built = dion::cuda::available();
  {
    dion::math::OwnCudaKernelsScope on(true);
    EXPECT_EQ(dion::math::own_fused_kernel(X, U), built);
    EXPECT_EQ(dion::math::own_mirror_kernel(P), built);
    {
      dion::math::OwnCudaKernelsScope off(false);  // scopes nest
      EXPECT_FALSE(dion::math::own_fused_kernel(X, U));
    }
    EXPECT_EQ(dion::math::own_fused_kernel(X, U), built);
  }
  EXPECT_FALSE(dion::math::own_fused_kernel(X, U));
  {
    ProcessWide on(true);
    EXPECT_EQ(dion::math::own_fused_kernel(X, U), built);
    EXPECT_EQ(dion::math::own_mirror_kernel(P), built);
    dion::math::OwnCudaKernelsScope off(false);  // a scope wins over the process-wide setting
    EXPECT_FALSE(dion::math::own_mirror_kernel(P));
  }
  EXPECT_FALSE(dion::math::use_own_cuda_kernels());
  // CPU tensors never take them, on or off.
  dion::math::OwnCudaKernelsScope on(true);
  EXPECT_FALSE(dion::math::own_fused_kernel(at::zeros({64, 96}), at::zeros({64, 96})));
  EXPECT_FALSE(dion::math::own_mirror_kernel(at::zeros({2, 8, 8})));
}

// The kernels' entry points refuse to run while the setting is off, so a call site that skipped
// the decision above cannot launch one: the error names the switches. Checked on tensors that
// only describe CUDA tensors (the refusal comes before any launch); bad arguments are still named
// first.
TEST(CudaDispatch, KernelEntryPointsRefuseWhileOff) {
  const at::Tensor X = described_cuda({64, 96}, at::kFloat), U = described_cuda({64, 96}, at::kFloat);
  const at::Tensor P = described_cuda({2, 32, 32}, at::kFloat);
  const std::string off = "the project's own CUDA kernels are off";
  EXPECT_NE(error_of([&] { dion::cuda::decay_and_update_(X, U, 0.9f, -0.1f); }).find("decay_and_update_: " + off),
            std::string::npos);
  EXPECT_NE(error_of([&] { dion::cuda::momentum_(X, U, at::Tensor(), 0.9f, false); }).find("momentum_: " + off),
            std::string::npos);
  EXPECT_NE(error_of([&] { dion::cuda::mirror_lower_to_upper_(P); }).find("mirror_lower_to_upper_: " + off),
            std::string::npos);
  EXPECT_NE(error_of([&] { dion::cuda::mirror_lower_to_upper_(P); }).find("set_own_cuda_kernels(true)"),
            std::string::npos);
  const at::Tensor wrong = described_cuda({64, 95}, at::kFloat);
  EXPECT_NE(error_of([&] { dion::cuda::decay_and_update_(X, wrong, 0.9f, -0.1f); }).find("shapes differ"),
            std::string::npos);
  // Turned on, the refusal is gone (what follows is the launch, which needs a device).
  dion::math::OwnCudaKernelsScope on(true);
  if (!at::hasCUDA()) {
    EXPECT_EQ(error_of([&] { dion::cuda::mirror_lower_to_upper_(P); }).find(off), std::string::npos);
  }
}

// OrthoConfig::cuda_kernels reaches the step: the orthogonalizer (here a recording one) runs with
// the kernels on for that optimizer only; the default optimizer's step runs with them off. On CPU
// tensors the result is the same either way.
TEST(CudaDispatch, OrthoConfigTurnsTheKernelsOnForItsOptimizerStep) {
  EXPECT_FALSE(dion::math::OrthoConfig{}.cuda_kernels);
  for (bool setting : {false, true}) {
    std::vector<bool> seen;
    dion::math::OrthoConfig ortho;
    ortho.cuda_kernels = setting;
    ortho.custom = [&seen](const at::Tensor& X, double eps) {
      seen.push_back(dion::math::use_own_cuda_kernels());
      return dion::math::newton_schulz(X, eps, at::kFloat);
    };
    at::manual_seed(5);
    at::Tensor w = at::randn({16, 24});
    w.mutable_grad() = at::randn({16, 24});
    dion::Optimizer opt({w}, dion::Options(0.02).algorithm("muon"), ortho);
    opt.step();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0], setting);
    EXPECT_FALSE(dion::math::use_own_cuda_kernels());  // the step's scope ended with it
  }
}

// The mirror CUDA tensors get by default (ATen's ops) equals the CPU loop bit for bit: odd sizes,
// from_row, 2-, 4- and 8-byte dtypes. A mirror that did nothing leaves the upper triangle random.
TEST(CudaDispatch, AtenMirrorEqualsTheCpuLoop) {
  at::manual_seed(14);
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat, at::kDouble})
    for (int64_t from_row : {int64_t{0}, int64_t{40}, int64_t{67}})
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{3, 67, 67}, {1, 1, 1}, {2, 0, 0}}) {
        SCOPED_TRACE(std::string(c10::toString(dt)) + " from_row " + std::to_string(from_row) + " " +
                     c10::str(at::IntArrayRef(shape)));
        const at::Tensor A = at::randn(shape).to(dt);
        at::Tensor loop = A.clone(), aten = A.clone();
        dion::math::mirror_lower_to_upper(loop, from_row);
        dion::math::mirror_lower_to_upper_with_aten_ops(aten, from_row);
        EXPECT_TRUE(at::equal(aten, loop));
        if (shape[1] > 1 && from_row < shape[1]) {
          EXPECT_FALSE(at::equal(aten, A));
          EXPECT_TRUE(at::equal(aten.tril(), A.tril()));
        }
      }
}

// On the GPU: a default optimizer step (fast path, so symmetric products too) launches none of the
// project's kernels; with OrthoConfig::cuda_kernels it launches them (fused steps, mirror).
TEST(Cuda, DefaultStepLaunchesNoOwnKernel) {
  SKIP_WITHOUT_CUDA();
  for (bool setting : {false, true}) {
    SCOPED_TRACE(setting ? "cuda_kernels true" : "default");
    dion::math::OrthoConfig ortho;
    ortho.path = dion::math::OrthoPath::FAST;
    ortho.cuda_kernels = setting;
    at::manual_seed(6);
    at::Tensor w = at::randn({12, 768, 768}, at::TensorOptions().device(at::kCUDA));
    w.mutable_grad() = at::randn_like(w);
    dion::Optimizer opt({w}, dion::Options(0.02).algorithm("muon"), ortho);
    const int64_t before = dion::cuda::own_kernel_launches();
    opt.step();
    const int64_t launched = dion::cuda::own_kernel_launches() - before;
    if (setting)
      EXPECT_GT(launched, 0);
    else
      EXPECT_EQ(launched, 0);
  }
}

}  // namespace
