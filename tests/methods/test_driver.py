"""The driver (refbayes.methods.driver): its documented order of draws, determinism, errors."""
import numpy as np
import pytest

from refbayes.datasets import make_logistic_regression
from refbayes.methods import driver, ngvi, slang
from refbayes.models import LogisticRegression

N, P, M = 30, 4, 8
D = P + 1


def _problem():
    s = make_logistic_regression(N, P, 0)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _slang(eig="exact"):
    return (slang.init(np.zeros(D), np.zeros((D, 2)), np.ones(D)),
            slang.SLANGConfig(N, np.ones(D), L=2, eig=eig))


@pytest.mark.parametrize("eig", ["exact", "randomized"])
def test_manual_replay_of_the_documented_draws_gives_the_same_state(eig):
    """Per epoch rng.permutation(N) cut into batches of M; per step eps (D, S), then Omega."""
    X, y, model = _problem()
    state, cfg = _slang(eig)
    out = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(7), epochs=2, M=M, S=2,
                     oversample=3)
    rng = np.random.default_rng(7)
    for _ in range(2):
        perm = rng.permutation(N)
        for i in range(0, N, M):
            idx = perm[i:i + M]
            eps = rng.standard_normal((D, 2))
            kw = {}
            if eig == "randomized":
                kw["Omega"] = rng.standard_normal((cfg.L + len(idx) * 2, cfg.L + 3))
            state, _ = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model, **kw)
    assert state.t == out.t == 2 * 4
    np.testing.assert_array_equal(out.mu, state.mu)
    np.testing.assert_array_equal(out.d, state.d)


def test_exact_curvature_draws_no_eps_and_same_seed_is_bit_identical():
    X, y, model = _problem()
    cfg = ngvi.NGVIConfig(N, np.ones(D), curvature="exact")
    runs = [driver.run(ngvi.init_full(np.zeros(D), np.eye(D)), cfg, model, X, y,
                       rng=np.random.default_rng(1), epochs=3, M=M) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].Sigma_inv, runs[1].Sigma_inv)
    rng = np.random.default_rng(1)
    for _ in range(3):
        rng.permutation(N)
    # only permutations were drawn: the next draw of both generators agrees
    rng_run = np.random.default_rng(1)
    driver.run(ngvi.init_full(np.zeros(D), np.eye(D)), cfg, model, X, y, rng=rng_run, epochs=3,
               M=M)
    assert rng_run.standard_normal() == rng.standard_normal()


def test_callback_once_per_epoch_and_progress_once_per_step():
    X, y, model = _problem()
    state, cfg = _slang()
    epochs, steps = [], []
    driver.run(state, cfg, model, X, y, rng=np.random.default_rng(0), epochs=3, M=M,
               callback=lambda e, s: epochs.append((e, s.t)), progress=steps.append)
    assert epochs == [(1, 4), (2, 8), (3, 12)]
    assert steps == [1] * 12


def test_non_finite_values_stop_with_the_step_named():
    """Inputs of 1e300 overflow the per-example gradients: TrainingError names step and epoch."""
    X, y, model = _problem()
    state, cfg = _slang()
    with pytest.raises(driver.TrainingError, match=r"step 1 \(epoch 1\): overflow"):
        driver.run(state, cfg, model, X * 1e300, y, rng=np.random.default_rng(0), epochs=1, M=M)


@pytest.mark.parametrize("kw, match", [
    (dict(M=0), "M: expected an integer in"),
    (dict(M=N + 1), "M: expected an integer in"),
    (dict(S=0), "S: expected an integer in"),
    (dict(epochs=-1), "epochs"),
    (dict(rng=0), "rng: expected a numpy.random.Generator"),
])
def test_bad_arguments(kw, match):
    X, y, model = _problem()
    state, cfg = _slang()
    args = dict(rng=np.random.default_rng(0), epochs=1, M=M) | kw
    with pytest.raises(ValueError, match=match):
        driver.run(state, cfg, model, X, y, **args)


def test_config_N_must_match_the_data():
    X, y, model = _problem()
    state, cfg = _slang()
    with pytest.raises(ValueError, match=r"cfg.N: expected the number of rows of X \(30\)"):
        driver.run(state, cfg._replace(N=100), model, X, y, rng=np.random.default_rng(0),
                   epochs=1, M=M)
    with pytest.raises(ValueError, match="state, cfg: expected"):
        driver.run(state, ngvi.NGVIConfig(N, np.ones(D)), model, X, y,
                   rng=np.random.default_rng(0), epochs=1, M=M)
