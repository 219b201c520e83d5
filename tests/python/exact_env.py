"""The exact environment on the Python side: the mirror of tests/support/exact_env.h.

Every CPU-dependent choice of torch's CPU kernels pinned, so that the reference vectors
(tests/vectors/reference, recorded by microsoft/dion under the same pins) reproduce bit for bit on
any x86-64 CPU: ATen's scalar kernels (ATEN_CPU_CAPABILITY=default), MKL's reproducible code path
(MKL_CBWR=COMPATIBLE), one thread, and oneDNN off (its bf16 GEMM kernels differ per CPU:
AMX, AVX512-BF16, AVX512, AVX2). tests/reference/README.md, "Exactness", has the measurements.

    import exact_env
    exact_env.pin_variables()       # before torch runs its first kernel
    import torch
    exact_env.pin_switches(torch)   # threads, oneDNN
    meta.update(exact_env.here(torch))           # when recording
    why = exact_env.differs(case, torch)         # when replaying: "" if the same

DION_TEST_ENV="NAME=VALUE,NAME=VALUE" sets more variables first (ctest emulates other CPUs with
it: ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS).
"""
import os
import platform

VARIABLES = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
             "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def apply_test_env():
    for item in filter(None, os.environ.get("DION_TEST_ENV", "").split(",")):
        name, sep, value = item.partition("=")
        if sep and name:
            os.environ[name] = value


def pin_variables():
    apply_test_env()
    os.environ.update(VARIABLES)


def pin_switches(torch):
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False


def mkl_branches(torch):
    """(branch in force, branch MKL would pick itself) from MKL's service entry points in
    libtorch_cpu.so (tests/support/exact_env.h: 3 is COMPATIBLE, 2 the non-Intel choice); (-1, -1)
    when this torch's MKL exports none."""
    import ctypes
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        return lib.mkl_serv_cbwr_get(1), lib.mkl_serv_cbwr_get_auto_branch()
    except (OSError, AttributeError):
        return -1, -1


MKL_BRANCH_COMPATIBLE = 3
MKL_AUTO_BRANCH_NON_INTEL = 2


def here(torch):
    """What this process runs under, in the vector files' metadata keys."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "threads": torch.get_num_threads(),
            "mkldnn": bool(torch.backends.mkldnn.enabled),
            "torch": torch.__version__.split("+")[0],
            "machine": platform.machine()}


def differs(recorded, torch):
    """'' when this process runs what `recorded` (a case's metadata) was recorded under."""
    for key, value in here(torch).items():
        if key not in recorded:
            return f"{key} is {value!r} here, not recorded"
        want = recorded[key]
        if key == "torch":
            want = str(want).split("+")[0]
        if want != value:
            return f"{key} is {value!r} here, {recorded[key]!r} when recorded"
    return ""


def unreachable(torch):
    """'' when bit-exact replay is possible on this CPU at all, else why not (the mirror of
    exact_unreachable_here in tests/support/exact_env.h): LibTorch's float32 sqrt is not correctly
    rounded on some CPUs (an AMD EPYC, family 26) even under the pinned environment, so vectors
    recorded where it is cannot replay bit for bit wherever a step takes a square root."""
    x = torch.linspace(0.25, 4.0, 4096, dtype=torch.float32)
    want = torch.sqrt(x.double()).float()  # correctly rounded (53 >= 2*24+2 bits)
    off = int((torch.sqrt(x) != want).sum())
    if off == 0:
        return ""
    return (f"LibTorch's float32 sqrt on this CPU is not correctly rounded ({off} of 4096 inputs off "
            f"by an ulp): its rounding depends on the microarchitecture, so vectors recorded on "
            f"another CPU cannot replay bit for bit")
