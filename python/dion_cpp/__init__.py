"""dion_cpp: the dion-cpp optimizers as a drop-in for microsoft/dion's Python classes.

    from dion_cpp import Muon, NorMuon, Dion2, Dion3, NorDion2, Dion
    opt = Dion2([{"params": matrices}, {"params": vectors, "algorithm": "adamw"}], lr=0.02)

    from dion_cpp.opt_utils import lm_head_lr_scale   # as the reference's train.py does
    clip = dion_cpp.QKClip(tau, [(wq, wk, n_heads, n_kv_heads), ...])   # after opt.step(): clip.apply(max_logits)

Each class is a torch.optim.Optimizer with the reference's constructor and param-group keys;
the math runs in the C++ library (libdion) over the same parameter tensors. Dion3 is NorDion2.
Build and install: docs/architecture.md ("How it ships"); reference: docs/optimizers.md.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from ._C import __version__  # noqa: E402  (the CMake project's version)
# The classes are generated from the C++ algorithm registry (_classes.py); these are the
# reference's. Others (a plugin's, loaded by load_algorithm_plugin or DION_ALGORITHM_PLUGINS)
# appear in classes() and as attributes of this package.
from ._classes import (  # noqa: E402
    Dion,
    Dion2,
    Dion3,
    DionMixedPrecisionConfig,
    Muon,
    NorDion2,
    NorMuon,
    classes,
    load_algorithm_plugin,
)
from ._qk_clip import QKClip  # noqa: E402
from .opt_utils import lm_head_lr_scale  # noqa: E402

__all__ = ["Muon", "NorMuon", "Dion2", "Dion3", "NorDion2", "Dion", "DionMixedPrecisionConfig",
           "classes", "load_algorithm_plugin", "lm_head_lr_scale", "QKClip", "__version__"]

globals().update({name: cls for name, cls in classes().items() if name not in globals()})
