"""dion_cpp.opt_utils: the helpers of the reference's dion/opt_utils.py that training scripts
import (microsoft/dion's train.py: `from dion.opt_utils import lm_head_lr_scale`).

What it is not: the reference's tensor helpers (to_local, AsyncTask, ...): the C++ library
does that work.
"""
import math


def lm_head_lr_scale(scalar_opt: str, model_dim: int) -> float:
    """The lm_head's lr multiplier: 1 / sqrt(model_dim) for Lion (Dion paper, App. D.2 and
    Fig. 14), 1 for AdamW; as the reference."""
    return 1 / math.sqrt(model_dim) if scalar_opt == "lion" else 1.0
