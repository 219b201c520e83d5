// GPU checks: skipped (with a reason) on machines without a CUDA device, such as CI.
//
// What they pin, on a GPU: the fused decay-and-update kernel equals its two-op ATen form; the
// optimizers run unchanged on CUDA tensors and agree with the CPU run (bf16 orthogonalization on
// different hardware: 1e-2 relative, about one bf16 ulp of the update). scripts/device_check.sh
// runs this binary on the lent GPU machine. (The NCCL path of dion::dist::Group needs two GPUs;
// the lent machine has one, so it is compiled here but not run anywhere yet.)
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "dion/cuda/fused.h"
#include "dion/dion.h"
#include "dion/math/dion.h"

namespace {

#define SKIP_WITHOUT_CUDA()                                                          \
  if (!at::hasCUDA() || !dion::cuda::available()) {                                  \
    GTEST_SKIP() << "no CUDA device (or built without CUDA kernels): GPU check skipped"; \
  }

TEST(Cuda, FusedDecayAndUpdateEqualsTwoOps) {
  SKIP_WITHOUT_CUDA();
  for (auto [xt, ut] : {std::pair{at::kFloat, at::kFloat}, {at::kFloat, at::kBFloat16}, {at::kBFloat16, at::kBFloat16}}) {
    at::Tensor X = at::randn({257, 129}, at::TensorOptions().device(at::kCUDA).dtype(xt));
    at::Tensor U = at::randn({257, 129}, at::TensorOptions().device(at::kCUDA).dtype(ut));
    at::Tensor expected = (X.to(at::kFloat) * 0.999f + U.to(at::kFloat) * -0.02f).to(xt);
    dion::cuda::decay_and_update_(X, U, 0.999f, -0.02f);
    const double tol = xt == at::kBFloat16 ? 1e-2 : 1e-6;
    EXPECT_LE((X.to(at::kFloat) - expected.to(at::kFloat)).abs().max().item<double>(), tol);
  }
}

TEST(Cuda, OptimizersMatchCpu) {
  SKIP_WITHOUT_CUDA();
  for (const char* algo : {"muon", "normuon", "dion2", "nordion2", "dion"}) {
    at::manual_seed(0);
    at::Tensor w = at::randn({64, 128}), g = at::randn({64, 128});
    at::Tensor wc = w.clone(), wg = w.to(at::kCUDA);
    wc.mutable_grad() = g.clone();
    wg.mutable_grad() = g.to(at::kCUDA);
    dion::Optimizer cpu({wc}, dion::Options(0.02).algorithm(algo));
    dion::Optimizer gpu({wg}, dion::Options(0.02).algorithm(algo));
    cpu.step();
    gpu.step();
    const double rel = (wg.cpu() - wc).abs().max().item<double>() / wc.abs().max().item<double>();
    EXPECT_LE(rel, 1e-2) << algo;
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
