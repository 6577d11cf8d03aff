"""Paper protocols, one module per experiment, run by ``refbayes reproduce <name>``.

Each experiment module exposes ``DESCRIPTION`` (one line), ``add_arguments(parser)`` (its own
options on an argparse sub-parser) and ``run(args) -> int`` (the exit status). ``EXPERIMENTS``
maps the command-line name to the module path, imported only when that experiment is run. The
machinery they share (jobs, resume, provenance, summaries) is ``refbayes.experiments._runner``;
what the command line needs of it is re-exported here: ``positive_int`` (an argparse type),
``thread_limit`` and ``retain_freed_memory`` (the BLAS threads and memory policy a run runs
under), ``interrupted_note`` and ``forget_run`` (what an interrupted run saved).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from refbayes.experiments._runner import (
    forget_run,
    interrupted_note,
    positive_int,
    retain_freed_memory,
    thread_limit,
)

__all__ = ["EXPERIMENTS", "forget_run", "get_experiment", "interrupted_note", "positive_int",
           "retain_freed_memory", "thread_limit"]

EXPERIMENTS: dict[str, str] = {
    "selfcheck": "refbayes.experiments.selfcheck",
    "slang-logreg": "refbayes.experiments.slang_logreg",
    "riemannian-laplace": "refbayes.experiments.riemannian_laplace",
    "calibration": "refbayes.experiments.calibration",
    "ktied": "refbayes.experiments.ktied",
    "uci": "refbayes.experiments.uci",
    "cifar10-lenet": "refbayes.experiments.cifar10_lenet",
}


def get_experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: expected one of {sorted(EXPERIMENTS)}, got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])
