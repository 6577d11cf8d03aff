"""The method records: one place to add a method. A trivial method defined here, with nothing but
its functions and its record, is driven by ``driver.run``, traced by ``refbayes.tracing`` and
verified against its own trace."""
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from refbayes import verify
from refbayes.methods import Batch, driver, records
from refbayes.methods._protocol import Record, TraceStart
from refbayes.tracing import TRACERS, build, drivers, field_tags
from refbayes.tracing.problems import N_ROWS, mlp_problem
from tests.tolerances import EXACT_F64, assert_close


# ----------------------------------------------------------------------------- a trivial method:
# noisy gradient descent, theta_{t+1} = theta_t - alpha (N / M) sum_{i in B} grad l_i(theta_t + eps)

class ToyConfig(NamedTuple):
    N: int
    alpha: float = 0.01


class ToyState(NamedTuple):
    theta: Any  # theta_t, (D,)  (toy.2)
    t: int      # steps taken


class ToyInfo(NamedTuple):
    w: Any      # theta_t + eps, (D,)  (toy.1)
    g: Any      # (N / M) sum_{i in B} grad l_i(w), (D,)  (toy.1)
    theta: Any  # theta_t - alpha g, (D,)  (toy.2)


def toy_step(state, batch, eps, cfg, model):
    w = state.theta + eps[:, 0]                                          # (toy.1)
    g = cfg.N / batch.X.shape[0] * model.grad(w, batch.X, batch.y)       # (toy.1)
    theta = state.theta - cfg.alpha * g                                  # (toy.2)
    return ToyState(theta, state.t + 1), ToyInfo(w, g, theta)


def _toy_start(mu, rng, N):
    return ToyState(mu, 0), ToyConfig(N, alpha=0.05)


TOY = Record("toy", ToyState, ToyConfig, toy_step, records.gaussian_draws, "derivations/toy.md",
             traces=(TraceStart("toy", _toy_start, {"M": 8, "S": 1}),))


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(records.RECORDS, "toy", TOY)
    monkeypatch.delitem(TRACERS, "toy", raising=False)
    drivers.register_record_traces({"toy": TOY})
    yield
    TRACERS.pop("toy", None)


def test_a_record_is_all_the_driver_needs(toy_registered):
    model, X, y = mlp_problem()
    state0 = ToyState(np.zeros(model.D), 0)
    out = driver.run(state0, ToyConfig(N_ROWS), model, X, y, rng=np.random.default_rng(0),
                     epochs=1, M=10, S=1)
    assert out.t == 5 and np.all(np.isfinite(out.theta)) and np.any(out.theta != 0)


def test_a_record_with_a_trace_start_is_traced_and_verifies(toy_registered):
    trace = build("toy", steps=3)
    assert list(trace.outputs) == ["w", "g", "theta", "state.t"]
    assert [trace.tags[n] for n in ("w", "g", "theta")] == ["(toy.1)", "(toy.1)", "(toy.2)"]
    assert trace.tags["input.state.theta"] == "(toy.2)"
    assert trace.manifest["derivation"] == "derivations/toy.md"
    # step 1 by hand, from the trace's own inputs
    model, _, _ = mlp_problem()
    theta0, eps = trace.inputs["input.state.theta"], trace.inputs["input.eps"][0]
    Xb, yb = trace.inputs["input.batch.X"][0], trace.inputs["input.batch.y"][0]
    w = theta0 + eps[:, 0]
    g = N_ROWS / Xb.shape[0] * model.grad(w, Xb, yb)
    assert_close(trace.outputs["theta"][0], theta0 - 0.05 * g, EXACT_F64)
    assert verify.compare(trace, {**trace.inputs, **trace.outputs}).ok
    # a planted bug in step 2 is found there, by its tag
    wrong = {**trace.outputs, "theta": trace.outputs["theta"].copy()}
    wrong["theta"][1] += 1e-6
    report = verify.compare(trace, wrong)
    assert not report.ok and "(toy.2)" in str(report)


def test_field_tags_read_the_comments_of_any_namedtuple():
    assert field_tags(ToyInfo) == {"w": "(toy.1)", "g": "(toy.1)", "theta": "(toy.2)"}
    assert field_tags(ToyState) == {"theta": "(toy.2)", "t": ""}


def test_every_record_names_an_existing_note_and_matching_types():
    root = Path(__file__).parents[1]
    for name, r in records.RECORDS.items():
        assert r.name == name
        assert (root / r.note).is_file(), r.note
        assert r.state.__name__.endswith("State") and r.config.__name__.endswith("Config")
        for start in r.traces:
            assert start.name in TRACERS and TRACERS[start.name].derivation == r.note


def test_record_of_names_the_supported_pairs():
    with pytest.raises(ValueError, match=r"state, cfg: expected one of the pairs \(FullState"):
        records.record_of(ToyState(np.zeros(2), 0), ToyConfig(3))


def test_the_driver_runs_ktied_by_its_record_as_a_hand_loop_does():
    """driver.run on a KTiedState: the epoch's batches, then eps (D, S), then ktied.step, the
    same bits as the loop written out (the record is all the driver needed)."""
    from refbayes.methods import ktied
    from refbayes.tracing.problems import ktied_problem
    model, X, y = ktied_problem()
    N, M, S = X.shape[0], 8, 2
    cfg = ktied.KTiedConfig(N=N, lam=1.0, alpha=0.01)
    start = ktied.init(0.1 * np.random.default_rng(1).standard_normal(model.D), model, 2,
                       sigma0=0.3, xi=np.zeros(ktied.layout(model, 2).P))
    out = driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=2, M=M, S=S)
    rng, state = np.random.default_rng(4), start
    for _ in range(2):
        for idx in driver.epoch_batches(rng, N, M):
            eps = rng.standard_normal((model.D, S))
            state, _ = ktied.step(state, Batch(X[idx], y[idx]), eps, cfg, model)
    assert out.t == state.t == 2 * -(-N // M)
    np.testing.assert_array_equal(out.mu, state.mu)
    np.testing.assert_array_equal(out.rho, state.rho)
