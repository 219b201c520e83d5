"""The Python classes of the built-in algorithms: names, the reference's constructor keywords (in
its order, with its defaults) and behaviours, keyed by the algorithm's registered name
(dion/optim/algorithm.h). _classes.py generates a class from an entry; a registered matrix
algorithm without one (a plugin's) gets default_entry().

A keyword's target says where its value goes: OPTION (the hyperparameter of the same name, or
`option`), FLOAT (likewise, as float(value)), EXTRA (a constructor keyword the C++ optimizer reads
itself: the orthogonalizer's, mixed_precision_config), FIXED (the reference accepts its default
only), MESH (the distribution keywords), IGNORED (accepted for the reference's signature) or
ATTRIBUTE (kept on the Python object: verbose). `default` is a Python literal.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


class Target(enum.Enum):
    OPTION = "option"
    FLOAT = "float"
    EXTRA = "extra"
    FIXED = "fixed"
    MESH = "mesh"
    IGNORED = "ignored"
    ATTRIBUTE = "attribute"


@dataclass(frozen=True)
class Keyword:
    name: str
    default: str
    target: Target = Target.OPTION
    option: Optional[str] = None  # the hyperparameter it sets, when not `name`


@dataclass(frozen=True)
class ClassEntry:
    name: str                     # the class ("Muon")
    keywords: Tuple[Keyword, ...]  # after `params`
    doc: str
    aliases: Tuple[str, ...] = ()  # other names of the same class ("Dion3")
    meshes: bool = False            # replicate / outer / inner shard meshes (else one distributed_mesh)
    selection_report: bool = False  # verbose prints which slices are selected (Dion2)
    lazy_state: bool = False        # state created at the first step, not at construction
    float_hyperparams: bool = False  # a group's lr stays a float (no live tensor)


# The reference's keywords of the orthonormal family and their defaults (microsoft/dion).
_FAMILY = {k.name: k for k in (
    Keyword("distributed_mesh", "None", Target.MESH),
    Keyword("lr", "0.01"),
    Keyword("fraction", "0.25", Target.FLOAT),
    Keyword("ef_decay", "0.95"),
    Keyword("mu", "0.95"),
    Keyword("muon_beta2", "0.95"),
    Keyword("betas", "(0.9, 0.95)"),
    Keyword("weight_decay", "0.01"),
    Keyword("cautious_wd", "False"),
    Keyword("epsilon", "1e-08"),
    Keyword("nesterov", "False"),
    Keyword("adjust_lr", "'spectral_norm'"),
    Keyword("flatten", "False"),
    Keyword("use_gram_newton_schulz", "False", Target.EXTRA),
    Keyword("use_triton", "False", Target.EXTRA),
    Keyword("use_polar_express", "True", Target.EXTRA),
    Keyword("newton_schulz_func", "None", Target.EXTRA),
    Keyword("verbose", "False", Target.ATTRIBUTE),
    Keyword("triton_post_ortho", "False", Target.IGNORED),
    Keyword("selection_scope", "'local'"),
    Keyword("selection_dim", "'shorter'"),
)}


def _family(*names: str) -> Tuple[Keyword, ...]:
    return tuple(_FAMILY[n] for n in names)


CLASSES: Dict[str, ClassEntry] = {
    "muon": ClassEntry(
        "Muon",
        _family("distributed_mesh", "lr", "mu", "betas", "weight_decay", "cautious_wd", "epsilon", "nesterov",
                "adjust_lr", "flatten", "use_gram_newton_schulz", "use_triton", "use_polar_express",
                "newton_schulz_func"),
        "Muon (reference: dion/muon.py)."),
    "normuon": ClassEntry(
        "NorMuon",
        _family("distributed_mesh", "lr", "mu", "muon_beta2", "betas", "weight_decay", "cautious_wd", "epsilon",
                "nesterov", "adjust_lr", "flatten", "use_gram_newton_schulz", "use_triton", "use_polar_express",
                "newton_schulz_func"),
        "NorMuon (reference: dion/normuon.py)."),
    "dion2": ClassEntry(
        "Dion2",
        _family("distributed_mesh", "lr", "fraction", "ef_decay", "betas", "weight_decay", "epsilon", "adjust_lr",
                "flatten", "use_triton", "use_polar_express", "use_gram_newton_schulz", "newton_schulz_func",
                "verbose", "triton_post_ortho", "selection_scope", "selection_dim"),
        "Dion2 (reference: dion/dion2.py). verbose=True prints, once per matrix shape and layout, whether rows or "
        "columns are selected (as the reference). triton_post_ortho is accepted and ignored. selection_dim "
        "(dion_cpp's own): on a sharded matrix, select along the dim one process would (\"shorter\", the default: "
        "equal to one process) or along the sharded dim as the reference does (\"shard\"); docs/distributed.md.",
        selection_report=True),
    "nordion2": ClassEntry(
        "NorDion2",
        _family("distributed_mesh", "lr", "fraction", "mu", "muon_beta2", "betas", "weight_decay", "epsilon",
                "adjust_lr", "flatten", "use_triton", "use_polar_express", "use_gram_newton_schulz",
                "newton_schulz_func", "triton_post_ortho", "selection_scope"),
        "NorDion2 (reference: dion/nordion2.py); also exported as Dion3. mu is the error-feedback decay "
        "here. triton_post_ortho is accepted and ignored.",
        aliases=("Dion3",)),
    "dion": ClassEntry(
        "Dion",
        (Keyword("replicate_mesh", "None", Target.MESH),
         Keyword("outer_shard_mesh", "None", Target.MESH),
         Keyword("inner_shard_mesh", "None", Target.MESH),
         Keyword("replicate_mesh_grad_sync", "True", Target.MESH),
         Keyword("rank_fraction", "1.0"),
         Keyword("rank_multiple_of", "1"),
         Keyword("lr", "0.01"),
         Keyword("mu", "0.95"),
         Keyword("betas", "(0.9, 0.95)"),
         Keyword("weight_decay", "0.01"),
         Keyword("epsilon", "1e-08"),
         Keyword("power_iters", "1", Target.FIXED),
         Keyword("qr_method", "'rcqr'", Target.FIXED),
         Keyword("cqr_warmup_steps", "150", Target.IGNORED),
         Keyword("rcqr_oversample", "1.25", Target.OPTION, "oversample"),
         Keyword("mixed_precision_config", "None", Target.EXTRA)),
        "Legacy Dion: low-rank power iteration (reference: dion/dion.py). 2-D matrices only. Meshes as in the "
        "reference: replicate_mesh (DDP, or HSDP's replicate dim; replicate_mesh_grad_sync: the optimizer averages "
        "the gradients, or only its compressed P and R), outer_shard_mesh (FSDP) and inner_shard_mesh (TP), the "
        "latter two 1-D sub-meshes of the DTensor parameters' mesh. A parameter's tensor dim that is Shard over the "
        "outer mesh's dim is the outer-sharded dim, likewise inner. Not supported: inner sharding without an outer "
        "shard mesh of more than one rank (NotImplementedError). cqr_warmup_steps is accepted and ignored; "
        "power_iters must be 1 and qr_method 'rcqr', as in the reference.",
        meshes=True, lazy_state=True, float_hyperparams=True),
}


def default_entry(info: dict) -> ClassEntry:
    """The class of a registered matrix algorithm with no entry above (a plugin's): named after
    it ("sign_descent" -> SignDescent), keywords distributed_mesh, lr, mu and weight_decay with the
    C++ defaults (info: a dict of _C.algorithms())."""
    name = "".join(part[:1].upper() + part[1:] for part in info["name"].split("_"))
    d = info["defaults"]
    return ClassEntry(
        name,
        (Keyword("distributed_mesh", "None", Target.MESH), Keyword("lr", repr(d["lr"])), Keyword("mu", repr(d["mu"])),
         Keyword("weight_decay", repr(d["weight_decay"]))),
        f"{name}: the registered algorithm '{info['name']}' (dion/optim/algorithm.h), with its defaults.")
