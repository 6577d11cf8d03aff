"""tools/torchsso_noisy_kfac_check.py: the inverse of the sampling map it uses to hand torchsso's
draws to ``noisy_kfac.step``, its refusals, and (where a pytorch-sso checkout is named by
REFBAYES_TORCHSSO) the side-by-side check itself."""
from __future__ import annotations

import os

import numpy as np
import pytest

from refbayes.methods import noisy_kfac as nk
from refbayes.models import MLP
from tests.tolerances import EXACT_F64
from tests.tools import load_tool

tool = load_tool("torchsso_noisy_kfac_check.py")


def _state(model, rng):
    state = nk.init(rng.standard_normal(model.D), model)
    A = tuple(F + (M := rng.standard_normal(F.shape)) @ M.T for F in state.A)
    S = tuple(F + (M := rng.standard_normal(F.shape)) @ M.T for F in state.S)
    return state._replace(A=A, S=S, A_ref=A, S_ref=S)


@pytest.mark.parametrize("sampler_damping", nk.SAMPLER_DAMPINGS)
def test_eps_from_draws_inverts_the_sampling_map(sampler_damping):
    """eps_from_draws(sample(eps)) = eps: (noisy_kfac.7) inverted per layer, gamma_ex > 0 so
    that the two sampler dampings differ."""
    rng = np.random.default_rng(0)
    model = MLP([3, 4, 2], "relu", "categorical")
    state = _state(model, rng)
    cfg = nk.NoisyKFACConfig(20, eta=0.5, kl_weight=0.7, gamma_ex=0.3,
                             sampler_damping=sampler_damping)
    eps = rng.standard_normal((model.D, 3))
    W = nk.sample(state, eps, cfg, model)
    got = tool.eps_from_draws(state, W, cfg, model)
    assert np.max(np.abs(got - eps)) / np.max(np.abs(eps)) < EXACT_F64
    other = cfg._replace(sampler_damping="full" if sampler_damping == "intrinsic" else
                         "intrinsic")
    assert np.max(np.abs(tool.eps_from_draws(state, W, other, model) - eps)) > 1e-3


def test_bad_input_is_refused(tmp_path):
    model = MLP([3, 4, 2], "relu", "categorical")
    state = _state(model, np.random.default_rng(1))
    with pytest.raises(ValueError, match="cfg.damping"):
        tool.eps_from_draws(state, np.zeros((model.D, 1)),
                            nk.NoisyKFACConfig(20, damping="exact"), model)
    with pytest.raises(FileNotFoundError, match="--torchsso"):
        tool.load_torchsso(tmp_path)


@pytest.mark.skipif(not os.environ.get("REFBAYES_TORCHSSO"),
                    reason="REFBAYES_TORCHSSO names no pytorch-sso checkout")
@pytest.mark.parametrize("momentum_type", ["preconditioned", "raw"])
def test_steps_equal_torchsso(capsys, momentum_type):
    pytest.importorskip("torch")
    assert tool.main(["--torchsso", os.environ["REFBAYES_TORCHSSO"],
                      "--momentum-type", momentum_type]) == 0
    out = capsys.readouterr().out
    assert "max relative error" in out and f"momentum_type {momentum_type!r}" in out
