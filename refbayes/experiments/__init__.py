"""Paper protocols, one module per experiment, run by ``refbayes reproduce <name>``.

Each experiment module exposes ``DESCRIPTION`` (one line), ``add_arguments(parser)`` (its own
options on an argparse sub-parser) and ``run(args) -> int`` (the exit status). ``EXPERIMENTS``
maps the command-line name to the module path, imported only when that experiment is run.
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "get_experiment"]

EXPERIMENTS: dict[str, str] = {
    "selfcheck": "refbayes.experiments.selfcheck",
    "slang-logreg": "refbayes.experiments.slang_logreg",
    "riemannian-laplace": "refbayes.experiments.riemannian_laplace",
    "calibration": "refbayes.experiments.calibration",
    "ktied": "refbayes.experiments.ktied",
}


def get_experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: expected one of {sorted(EXPERIMENTS)}, got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])
