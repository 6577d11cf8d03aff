"""tools/cifar10_epoch_timing.py's cases for the rows of issue 36's second list (the runner's
ktied and swag rows, by --cases) take steps on a small batch, and the Laplace timing runs on a
few rows (the tool's API stays in step with the runner's)."""
from __future__ import annotations

import contextlib
import io

import numpy as np

from refbayes.methods import Batch
from refbayes.models.conv import lenet5
from tests.tools import load_tool

tool = load_tool("cifar10_epoch_timing.py", "cifar10_epoch_timing_rows")


def test_the_new_cases_take_steps_on_a_small_batch():
    net = lenet5()
    cases, _ = tool.make_cases(net, "float32", np.random.default_rng(1), ("ktied", "swag"))
    assert {name: M for name, (M, _) in cases.items()} == {"k-tied (k=2, S=1)": 128,
                                                           "SWAG job (SGD, 0.05)": 128}
    rng = np.random.default_rng(2)
    X = tool.normalize(rng.random((4, 3, 32, 32))).reshape(4, -1).astype(np.float32)
    batch = Batch(X, rng.integers(0, 10, 4))
    for _, step in cases.values():
        step(batch)
        step(batch)


def test_the_laplace_timing_prints_both_rows():
    net = lenet5()
    rng = np.random.default_rng(3)
    X = rng.standard_normal((8, 3072)).astype(np.float32)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tool.time_laplace(net, X, rng.integers(0, 10, 8), X[:4], 8)
    text = out.getvalue()
    assert "laplace-kron" in text and "laplace-ll" in text and "GLM draw" in text
