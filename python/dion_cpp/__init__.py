"""dion_cpp: the dion-cpp optimizers as a drop-in for microsoft/dion's Python classes.

    from dion_cpp import Muon, NorMuon, Dion2, Dion3, NorDion2, Dion
    opt = Dion2([{"params": matrices}, {"params": vectors, "algorithm": "adamw"}], lr=0.02)

Each class is a torch.optim.Optimizer with the reference's constructor and param-group keys;
the math runs in the C++ library (libdion) over the same parameter tensors. Dion3 is NorDion2.
Build: see README ("Python module").
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from ._optimizers import (  # noqa: E402
    Dion,
    Dion2,
    Dion3,
    DionMixedPrecisionConfig,
    Muon,
    NorDion2,
    NorMuon,
)

__all__ = ["Muon", "NorMuon", "Dion2", "Dion3", "NorDion2", "Dion", "DionMixedPrecisionConfig"]
