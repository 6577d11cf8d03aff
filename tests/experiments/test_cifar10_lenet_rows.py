"""`refbayes reproduce cifar10-lenet`'s rows beyond Table 1 (issue 36's second list) on --quick
(256 train / 200 test images): the swag job's three rows come from one SGD run; the Laplace rows
read the adam job's final state and refuse clearly without it (or with one trained otherwise);
ktied and swag resume after an interruption to the uninterrupted numbers bit for bit.

Skips without the staged cifar10 data (CI has it)."""
import json

import numpy as np
import pytest
from scipy.special import softmax

from refbayes.experiments import cifar10_lenet as exp
from refbayes.experiments.calibration_methods import laplace_state
from refbayes.methods import laplace, mc_dropout, swag
from refbayes.methods.driver import draw_masks
from refbayes.models import dropout
from refbayes.models.conv import lenet5
from tests.experiments.test_cifar10_lenet import QUICK, _run


def _state(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_the_three_swag_rows_come_from_one_sgd_run(tmp_path, cifar_dir):
    # 3 epochs: swa_start = 3 x 161 / 300 = 1.61, snapshots after epochs 2 and 3
    status, stdout, err = _run([*QUICK, "--methods", "swag", "--epochs", "3", "--data-dir",
                                str(cifar_dir), "--out", str(tmp_path)])
    assert status == 0, err
    recs = {n: json.loads((tmp_path / n / "seed_0.json").read_text())
            for n in ("swa", "swag-diag", "swag")}
    for n, r in recs.items():
        assert n in stdout
        assert r["settings"]["method"] == n and r["seconds"] == recs["swag"]["seconds"]
        assert r["provenance"] == recs["swag"]["provenance"]
    assert recs["swag"]["settings"]["swa_start"] == pytest.approx(3 * 161 / 300)
    assert recs["swag"]["found"] == {"snapshots": 2, "rank": 2, "low_rank": True}
    assert recs["swa"]["settings"]["job"] == "swag" and recs["swa"]["curve"] == []
    assert recs["swa"]["final"] != recs["swag"]["final"] != recs["swag-diag"]["final"]
    z = _state(tmp_path / "states" / "swag_seed_0.npz")
    assert int(z["state.1.n"]) == 2  # (SGDState, SWAGState): the moments of that one run
    theta_bar = z["state.1.theta_bar"]
    # swa's predictions are the softmax at theta_SWA ...
    data = exp._load(cifar_dir, "float32", True, 256, 200)
    P = softmax(lenet5().forward(theta_bar, data.X_test).astype(np.float64), axis=1)
    got = np.load(tmp_path / "predictions" / "swa_seed_0.npz")["probs"]
    np.testing.assert_array_equal(got, P.astype(np.float32))
    # ... the mean the swag and swag-diag rows sample around (z = 0 gives theta_bar)
    st = swag.SWAGState(theta_bar, z["state.1.theta2_bar"], z["state.1.D_hat"], 2)
    zero = np.zeros((theta_bar.size, 1), dtype=theta_bar.dtype)
    for scale, z2 in ((0.5, np.zeros((2, 1), dtype=theta_bar.dtype)), (1.0, None)):
        th = swag.sample(st, zero, z2, swag.SWAGConfig(K=exp.SWAG_K, scale=scale))
        np.testing.assert_array_equal(th[:, 0], theta_bar)


@pytest.mark.slow
def test_laplace_rows_read_the_adam_state_and_refuse_without_it(tmp_path, cifar_dir):
    argv = [*QUICK, "--data-dir", str(cifar_dir), "--out", str(tmp_path)]
    status, _, err = _run([*argv, "--methods", "laplace-kron"])
    assert status == 2 and "adam job of seed 0" in err and "--methods adam" in err
    assert not (tmp_path / "laplace-kron").exists()
    status, _, err = _run([*argv, "--methods", "adam"])
    assert status == 0, err
    status, stdout, err = _run([*argv, "--methods", "laplace-kron,laplace-ll"])
    assert status == 0, err
    for name, (structure, subset) in exp.POSTHOC.items():
        rec = json.loads((tmp_path / name / "seed_0.json").read_text())
        s = rec["settings"]
        assert (s["structure"], s["subset"], s["epochs"]) == (structure, subset, 0)
        assert s["prior_precision"] == 256 * exp.WEIGHT_DECAY
        assert s["map"]["method"] == "adam" and s["map"]["epochs"] == 1
        found = rec["found"]
        assert found["prior_precision"] > 0 and np.isfinite(found["log_marglik"])
        assert 0 <= found["scores"]["acc"] <= 1
        assert np.load(tmp_path / "predictions" / f"{name}_seed_0.npz")["probs"].shape == (200, 10)
        assert name in stdout
        adam_rec = json.loads((tmp_path / "adam" / "seed_0.json").read_text())
        assert rec["map_state_sha256"] == adam_rec["final_state_sha256"]
        # the fit's CPU time is its own record now, inside the job's (measured_posthoc_seconds)
        assert 0 < rec["fit_cpu_seconds"] <= rec["cpu_seconds"]
    # a state that is not the saved adam result's final state (a stale file) is refused
    state = _state(tmp_path / "states" / "adam_seed_0.npz")
    state["state.theta"] = state["state.theta"] + np.float32(1e-3)
    np.savez(tmp_path / "states" / "adam_seed_0.npz", **state)
    (tmp_path / "laplace-ll" / "seed_0.json").unlink()  # else the saved row is reused
    status, _, err = _run([*argv, "--methods", "laplace-ll"])
    assert status == 2 and "is not the final state of the saved adam result" in err, err
    # an adam state trained with other settings (1 epoch, these rows now expect 2) is refused
    status, _, err = _run([*argv, "--methods", "laplace-ll", "--epochs", "2", "--fresh"])
    assert status == 2 and "was trained with" in err


def test_laplace_rows_scheduled_after_adam_in_one_serial_run_but_not_in_parallel(tmp_path):
    status, _, err = _run([*QUICK, "--methods", "adam,laplace-ll", "--jobs", "2", "--out",
                           str(tmp_path)])
    assert status == 2 and "run the jobs at once" in err


def test_make_method_refuses_posthoc_rows_and_ktied_without_its_generator():
    net = lenet5()
    with pytest.raises(ValueError, match="post-hoc"):
        exp.make_method("laplace-kron", net, np.zeros(net.D), 10)
    with pytest.raises(ValueError, match="init_rng"):
        exp.make_method("ktied", net, np.zeros(net.D), 10)


@pytest.mark.parametrize("structure, subset", [("kron", "all"), ("full", "last_layer")])
def test_evidence_tuned_on_one_row_finds_the_full_data_optimum(structure, subset):
    # checks (laplace.26): the rows enter the categorical evidence through log p(D | mu) only:
    # the same optimum, the same log evidence once the loss of all rows is put back
    net = lenet5()
    rng = np.random.default_rng(3)
    theta = net.init_theta(rng, dtype=np.float64, scheme="pytorch")
    X, y = rng.standard_normal((40, 3072)), rng.integers(0, 10, 40)
    cfg = laplace.LaplaceConfig(prior_precision=3.0, structure=structure, curvature="ggn",
                                subset=subset)
    state = laplace_state(net, theta, X, y, cfg)
    shift = float(net.loss(theta, X[:1], y[:1])) - float(net.loss(theta, X, y))
    for delta in (3.0, 40.0):  # the identity itself, at the fit's and at another precision
        z_all = laplace.log_marginal_likelihood_grad(net, state, X, y, cfg, delta).log_marglik
        z_one = laplace.log_marginal_likelihood_grad(net, state, X[:1], y[:1], cfg,
                                                     delta).log_marglik
        assert float(z_one) + shift == pytest.approx(float(z_all), rel=1e-12)
    _, info = laplace.optimize_prior_precision(net, state, X, y, cfg, method="lbfgs",
                                               prior_structure="scalar", init_prior_prec=3.0)
    tuned, found = exp.evidence_tuned(net, state, X, y, cfg)
    assert found["converged"] and found["prior_precision"] == pytest.approx(
        float(info.prior_precision), rel=1e-5)
    assert found["log_marglik"] == pytest.approx(float(info.log_marglik), rel=1e-10)
    np.testing.assert_allclose(tuned.prior_prec, found["prior_precision"], rtol=1e-12)


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_ktied_and_swag_resume_to_the_same_numbers(tmp_path, cifar_dir, monkeypatch):
    argv = [*QUICK, "--methods", "ktied,swag", "--epochs", "3", "--eval-every", "1",
            "--data-dir", str(cifar_dir)]
    status, _, err = _run([*argv, "--out", str(tmp_path / "a")])
    assert status == 0, err
    save = exp._save_checkpoint
    calls = []

    def stopping(path, state, meta):  # save, then stop during swag's (second job's) epoch 3
        save(path, state, meta)
        calls.append(path)
        if len(calls) == 6 + 5:
            raise _Stop

    monkeypatch.setattr(exp, "_save_checkpoint", stopping)
    with pytest.raises(_Stop):
        _run([*argv, "--out", str(tmp_path / "b")])
    monkeypatch.setattr(exp, "_save_checkpoint", save)
    meta = json.loads(str(np.load(calls[-1])["meta"]))
    assert "swag" in calls[-1].name and (meta["epoch"], meta["step"]) == (2, 1)
    status, _, err = _run([*argv, "--out", str(tmp_path / "b")])
    assert status == 0, err
    for name in ("ktied", "swa", "swag-diag", "swag"):
        a, b = (json.loads((tmp_path / d / name / "seed_0.json").read_text()) for d in "ab")
        strip = lambda c: [{k: v for k, v in r.items() if k != "seconds"} for r in c]
        assert strip(a["curve"]) == strip(b["curve"])
        assert a["final"] == b["final"]
        pa, pb = (np.load(tmp_path / d / "predictions" / f"{name}_seed_0.npz")["probs"]
                  for d in "ab")
        np.testing.assert_array_equal(pa, pb)
    for name in ("ktied", "swag"):
        sa, sb = (_state(tmp_path / d / "states" / f"{name}_seed_0.npz") for d in "ab")
        assert sa.keys() == sb.keys()
        for k in sa:
            if k != "meta":
                np.testing.assert_array_equal(sa[k], sb[k])


def test_the_official_mc_dropout_row_masks_the_official_sites():
    # checks (mc_dropout.10): the row's masks are LeNet5MCDropout's dropout(layer(x)) sites, and
    # its step is mc_dropout.step with draw_masks at those sites from the step's generator
    net = lenet5()
    assert exp.DROPOUT_SITES["mc-dropout-official"] == list(dropout.output_sites(net))
    rng = np.random.default_rng(0)
    theta0 = net.init_theta(rng, scheme="pytorch")
    X, y = rng.standard_normal((4, 3 * 32 * 32)), rng.integers(0, 10, 4)
    batch = mc_dropout.Batch(X, y)
    m = exp.make_method("mc-dropout-official", net, theta0, 100)
    state, info = m.step(m.state, batch, np.random.default_rng(7), 0, 0)
    sites = dropout.output_sites(net)
    masks = draw_masks(np.random.default_rng(7), net, 4, 0.1, sites=sites)
    assert [z.shape[1:] for z in masks] == dropout.mask_shapes(net, sites)
    cfg = mc_dropout.MCDropoutConfig(100, p=0.1, lengthscale=np.sqrt(100 * exp.WEIGHT_DECAY * 0.9),
                                     alpha=1e-3, eps_adam=100 * exp.ADAM_EPS, sites=sites)
    want, _ = mc_dropout.step(mc_dropout.init(theta0), batch, masks, cfg, net)
    assert np.array_equal(state.theta, want.theta)
    # the default row differs only in where the masks sit
    m0 = exp.make_method("mc-dropout", net, theta0, 100)
    assert not np.array_equal(m0.step(m0.state, batch, np.random.default_rng(7), 0, 0)[0].theta,
                              state.theta)
