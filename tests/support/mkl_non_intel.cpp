/* tests/support/mkl_non_intel.cpp — makes MKL take the code paths it takes on a non-Intel CPU (an
 * AMD EPYC, say), on this machine, so that the exact tests can show that their pins hold there.
 *
 * MKL (linked into libtorch_cpu.so, which exports its symbols) asks mkl_serv_intel_cpu_true()
 * whether it runs on an Intel CPU before it dispatches its BLAS, LAPACK and vector-math kernels;
 * a definition here, loaded first (LD_PRELOAD, or linked into a test binary with its symbols
 * exported), interposes on MKL's own and answers no. tests/CMakeLists.txt builds it as the shared
 * library dion_test_mkl_non_intel (exact_cpu_nonintel.* tests, python_reference_exact_nonintel).
 *
 * Measured on an Intel Xeon (AVX512-FP16, no AMX), oneMKL 2024.0 in torch 2.11.0: under
 * MKL_CBWR=AVX2 torch.sqrt of 1e6 floats is correctly rounded with the Intel answer and off by an
 * ulp on 169,611 of them with this shim (MKL's non-Intel path); under MKL_CBWR=COMPATIBLE both
 * give the same bits (the exact environment's choice, tests/support/exact_env.h). */
extern "C" {
int mkl_serv_intel_cpu_true(void) { return 0; }
int mkl_serv_intel_cpu(void) { return 0; }
/* Whether this definition is the one in force: exact_env.h's mkl_takes_non_intel_paths() finds
 * it through dlsym and checks that MKL's own entry point answers no. */
int dion_test_mkl_non_intel(void) { return 1; }
}
