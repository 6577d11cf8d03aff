"""Declarative model cases for tests/models (BackPACK style): a readable id, a model, a batch size.

Inputs come from a fixed-seed Generator per case: theta ~ N(0, 0.6^2) (so relu units are neither
all dead nor all linear), X ~ N(0, 1), y from the likelihood's target set. Continuous random
inputs put a pre-activation exactly at the relu kink with probability zero, so the autograd
comparisons never sit on relu'(0) (which refbayes defines as 0).
"""
from typing import NamedTuple

import numpy as np

from refbayes.models import MLP, LogisticRegression, SoftmaxRegression

__all__ = ["Case", "CASES", "LINEAR_CASES", "DEEP_CASES", "batch", "ids"]


class Case(NamedTuple):
    id: str
    model: object
    M: int = 6


def _mlp_cases():
    out = []
    for act in ("relu", "tanh", "sigmoid"):
        out += [Case(f"mlp-{act}-gaussian-1h", MLP([4, 6, 1], act, "gaussian", noise_precision=2.5)),
                Case(f"mlp-{act}-bernoulli-1h", MLP([4, 6, 1], act, "bernoulli")),
                Case(f"mlp-{act}-categorical-1h", MLP([4, 6, 3], act, "categorical"))]
    out += [Case("mlp-relu-categorical-2h", MLP([4, 5, 6, 3], "relu", "categorical")),
            Case("mlp-tanh-gaussian2out-2h", MLP([3, 5, 4, 2], "tanh", "gaussian", noise_precision=0.7)),
            Case("mlp-sigmoid-bernoulli-2h", MLP([4, 5, 4, 1], "sigmoid", "bernoulli")),
            Case("mlp-relu-gaussian3out-2h", MLP([3, 4, 5, 3], "relu", "gaussian"), M=9)]
    return out


LINEAR_CASES = [
    Case("logistic-intercept", LogisticRegression(4, intercept=True)),
    Case("logistic-nointercept", LogisticRegression(4, intercept=False)),
    Case("softmax-intercept", SoftmaxRegression(4, 3)),
    Case("softmax-nointercept", SoftmaxRegression(3, 4, intercept=False)),
    Case("mlp-nohidden-gaussian2out", MLP([4, 2], likelihood="gaussian", noise_precision=3.0)),
    Case("mlp-nohidden-bernoulli", MLP([4, 1], likelihood="bernoulli")),
]
DEEP_CASES = _mlp_cases()
CASES = LINEAR_CASES + DEEP_CASES


def ids(cases):
    return [c.id for c in cases]


def batch(case, dtype=np.float64, xp=np, seed=0):
    """(theta, X, y) for ``case`` on backend ``xp``; theta and X in ``dtype``, y as the model wants."""
    rng = np.random.default_rng(seed)
    model, M = case.model, case.M
    theta = 0.6 * rng.standard_normal(model.D)
    X = rng.standard_normal((M, model.sizes[0]))
    K = model.sizes[-1]
    name = model.likelihood.name
    if name == "gaussian":
        y = rng.standard_normal(M) if K == 1 else rng.standard_normal((M, K))
    else:
        y = rng.integers(0, 2 if name == "bernoulli" else K, size=M)
    return xp.asarray(theta.astype(dtype)), xp.asarray(X.astype(dtype)), xp.asarray(y)
