"""laplace-torch (aleximmer/Laplace) ``Laplace(model, ...)`` <-> ``laplace.LaplaceConfig``.

derivations/laplace.md, "Conventions of public implementations".
"""
from __future__ import annotations

from refbayes.conventions._common import _config, _fixed, _scalar_prec
from refbayes.methods import laplace

__all__ = [
    "from_laplace_torch",
    "to_laplace_torch",
]


_LT_STRUCTURES = ("full", "diag")
_LT_SUBSETS = ("all", "last_layer")
_LT_LIKELIHOODS = ("regression", "classification")
_LT_BACKEND = {"ggn": "BackPackGGN", "ef": "BackPackEF", "hessian": "AsdlHessian"}


def _lt_curvature(backend) -> str:
    if not isinstance(backend, str):
        raise ValueError(f"backend: expected the backend class's name (str), got {backend!r}")
    if backend == "AsdlHessian":
        return "hessian"
    if backend.endswith("GGN"):
        return "ggn"
    if backend.endswith("EF"):
        return "ef"
    raise ValueError("backend: expected a laplace-torch backend name ending in 'GGN' or 'EF', "
                     f"or 'AsdlHessian', got {backend!r}")


def from_laplace_torch(*, likelihood, subset_of_weights, hessian_structure, prior_precision=1.0,
                       prior_mean=0.0, temperature=1.0,
                       backend="BackPackGGN") -> laplace.LaplaceConfig:
    """Convert laplace-torch ``Laplace(model, ...)`` keyword arguments to a LaplaceConfig.

    derivations/laplace.md, "Conventions of public implementations": structure and curvature
    as the backend ('...GGN' -> "ggn", '...EF' -> "ef", 'AsdlHessian' -> "hessian"), the same
    prior_precision and subset. Not a config field: ``sigma_noise`` is the model's
    noise_precision = 1 / sigma_noise^2. Refused: hessian_structure "kron" (laplace-torch has no
    W-b cross block, (laplace.22)), "lowrank", "gp"; temperature != 1 and prior_mean != 0
    (refbayes has neither); the EF for regression (laplace-torch's is 2 / tau times the EF of the
    log-likelihood; no config reproduces it).

    Parameters
    ----------
    likelihood : {"regression", "classification"}
        The likelihood (only used to refuse the regression EF).
    subset_of_weights : {"all", "last_layer"}
        Which parameters are random.
    hessian_structure : {"full", "diag"}
        The precision's structure.
    prior_precision : float, default 1.0
        Scalar prior precision > 0 (per tensor: ``laplace.expand_prior_precision``).
    prior_mean : float, default 0.0
        Must be 0.
    temperature : float, default 1.0
        Must be 1.
    backend : str, default "BackPackGGN"
        The backend class's name.

    Returns
    -------
    laplace.LaplaceConfig
        The config whose posterior precision and evidence are laplace-torch's.

    Raises
    ------
    ValueError
        If an argument is out of range or not representable.
    """
    _fixed(likelihood, "likelihood", _LT_LIKELIHOODS, "laplace-torch's likelihoods")
    _fixed(subset_of_weights, "subset_of_weights", _LT_SUBSETS, "the subsets refbayes has")
    _fixed(hessian_structure, "hessian_structure", _LT_STRUCTURES,
           "laplace-torch's 'kron' has no W-b cross block (laplace.22); no lowrank / gp")
    _fixed(prior_mean, "prior_mean", (0.0,), "refbayes' prior is centred at 0")
    _fixed(temperature, "temperature", (1.0,), "refbayes has no tempering")
    curvature = _lt_curvature(backend)
    if curvature == "ef" and likelihood == "regression":
        raise ValueError("backend: an EF backend with likelihood 'regression' is not mapped "
                         "(laplace-torch's regression EF is 2 / tau times refbayes' 'ef'; "
                         f"derivations/laplace.md), got {backend!r}")
    return laplace.LaplaceConfig(
        prior_precision=_scalar_prec(prior_precision, "prior_precision",
                                     "this mapping (per-tensor values: expand_prior_precision)"),
        structure=hessian_structure, curvature=curvature, subset=subset_of_weights)


def to_laplace_torch(cfg: laplace.LaplaceConfig, likelihood: str) -> dict:
    """Convert a LaplaceConfig to laplace-torch ``Laplace(model, ...)`` keyword arguments.

    The inverse of ``from_laplace_torch`` (backend 'BackPackGGN', 'BackPackEF' or
    'AsdlHessian'). Set ``sigma_noise`` = 1 / sqrt(noise_precision) from the model.

    Parameters
    ----------
    cfg : laplace.LaplaceConfig
        A config with structure "full" or "diag" and a scalar prior precision.
    likelihood : {"regression", "classification"}
        The model's likelihood.

    Returns
    -------
    dict
        Keyword arguments likelihood, subset_of_weights, hessian_structure, prior_precision,
        prior_mean, temperature, backend.

    Raises
    ------
    ValueError
        If cfg is not a LaplaceConfig, has structure "kron", an array prior precision, or the
        "ef" curvature for regression.
    """
    _config(cfg, laplace.LaplaceConfig)
    _fixed(likelihood, "likelihood", _LT_LIKELIHOODS, "laplace-torch's likelihoods")
    _fixed(cfg.structure, "cfg.structure", _LT_STRUCTURES,
           "laplace-torch's 'kron' has no W-b cross block (laplace.22)")
    _fixed(cfg.subset, "cfg.subset", _LT_SUBSETS, "laplace-torch's subsets")
    _fixed(cfg.curvature, "cfg.curvature", tuple(_LT_BACKEND), "the curvatures refbayes has")
    if cfg.curvature == "ef" and likelihood == "regression":
        raise ValueError("cfg.curvature: 'ef' with likelihood 'regression' is not mapped "
                         "(laplace-torch's regression EF is 2 / tau times refbayes' 'ef')")
    return {"likelihood": likelihood, "subset_of_weights": cfg.subset,
            "hessian_structure": cfg.structure,
            "prior_precision": _scalar_prec(cfg.prior_precision, "cfg.prior_precision",
                                            "this mapping"),
            "prior_mean": 0.0, "temperature": 1.0, "backend": _LT_BACKEND[cfg.curvature]}

