"""tools/cifar10_epoch_timing.py (issue 36 part 1, derivations/cifar10_lenet.md): the official
normalization, the VOGN config converted from the official LeNet-5 config, and one step of every
timed case on a small random batch (the tool's API stays in step with the methods')."""
from __future__ import annotations

import numpy as np
import pytest

from refbayes.methods import Batch
from refbayes.models.conv import lenet5
from tests.tools import load_tool

tool = load_tool("cifar10_epoch_timing.py", "cifar10_epoch_timing")


def test_normalize_is_the_official_per_channel_transform():
    # distributed/classification/main.py l.170: Normalize((0.4914, 0.4822, 0.4465),
    # (0.2023, 0.1994, 0.2010)), applied after ToTensor (pixels / 255)
    np.testing.assert_array_equal(tool.MEAN, [0.4914, 0.4822, 0.4465])
    np.testing.assert_array_equal(tool.STD, [0.2023, 0.1994, 0.2010])
    X = np.random.default_rng(0).random((3, 3, 32, 32))
    Z = tool.normalize(X)
    for c in range(3):
        np.testing.assert_allclose(Z[:, c], (X[:, c] - tool.MEAN[c]) / tool.STD[c], rtol=0,
                                   atol=1e-15)


def test_official_vogn_config_has_the_config_files_values():
    cfg = tool.official_vogn_config()
    assert cfg.N == 50000 and cfg.rho == 1.0 and cfg.curvature == "ef"
    assert cfg.delta == pytest.approx(100.0, rel=1e-14)   # prior_variance 1e-2
    assert (cfg.alpha, cfg.beta1, cfg.beta2, cfg.gamma, cfg.tau) == (1e-4, 0.9, 0.999, 1e-3, 1.0)


@pytest.mark.parametrize("dtype", ["float32"])
def test_every_case_takes_steps_on_a_small_batch(dtype):
    net = lenet5()
    cases, theta0 = tool.make_cases(net, dtype, np.random.default_rng(1))
    assert theta0.dtype == np.dtype(dtype) and theta0.shape == (net.D,)
    assert {name: M for name, (M, _) in cases.items()} == {
        "Adam": 128, "VOGN (S=6, ef)": 128, "BBB (S=1)": 128, "MC dropout (p=0.1)": 128,
        "K-FAC (T_inv=1)": 128, "Noisy K-FAC (S=4, T_inv=1)": 64, "SGD (SWAG's base)": 128}
    rng = np.random.default_rng(2)
    X = tool.normalize(rng.random((4, 3, 32, 32))).reshape(4, -1).astype(dtype)
    batch = Batch(X, rng.integers(0, 10, 4))
    for _, step in cases.values():
        step(batch)
        step(batch)
