// Coefficient tables of the polynomial orthogonalizers (private to src/math).
//
// What it is: the per-step (a, b, c) of X <- a X + b (X X^T) X + c (X X^T)^2 X for the quintic
// Newton-Schulz, the reference's Polar Express and the gram-newton-schulz package's Polar Express,
// shared by the exact (ortho.cpp) and fast (ortho_fast.cpp) paths. Not a public API.
#pragma once

#include <array>

namespace dion::math::detail {

struct Coeffs {
  double a, b, c;
};

// The quintic Newton-Schulz coefficients, one triple per step (reference:
// newton_schulz_triton.zeropower_via_newtonschulz5).
constexpr std::array<Coeffs, 5> kNewtonSchulz = {{
    {4.0848, -6.8946, 2.9270},
    {3.9505, -6.3029, 2.6377},
    {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046},
    {2.8366, -3.0525, 1.2012},
}};

// Polar Express coefficients for 5 steps, safety factor 2e-2, cushion 2 (arXiv 2505.16932);
// the 1.02 safety factor is baked into all but the last polynomial (reference: polar_express.py).
constexpr std::array<Coeffs, 5> kPolarExpress = {{
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
}};

// The gram-newton-schulz package's POLAR_EXPRESS_COEFFICIENTS (0.1.6), which the reference's
// use_gram_newton_schulz=True uses: the paper's unmodified triples divided by (1.05, 1.05^3,
// 1.05^5), printed from the package with Python's repr.
constexpr std::array<Coeffs, 5> kGramPolarExpress = {{
    {7.892582874424408, -20.38301394587957, 13.555306149406924},
    {3.911484868135431, -2.5464635929060884, 0.4268988319673074},
    {3.760657955697423, -2.512819018216563, 0.4323647349070073},
    {3.160399673686287, -2.149649518898498, 0.3996366907664389},
    {2.1910971618617303, -1.441662010214663, 0.328146487623155},
}};

// The reference's gram_newton_schulz_reset_iterations=[2]: at step 2 the accumulated
// polynomial Q is applied to X and the Gram matrix recomputed from it.
constexpr int kGramResetStep = 2;

}  // namespace dion::math::detail
