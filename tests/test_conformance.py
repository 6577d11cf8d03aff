"""`refbayes conformance`: laplace-torch, ivon-opt, BackPACK and curvlinops against refbayes on
identical inputs.

The reports need torch and the library (the `conformance` extra) and skip without them; the CLI
tests (--list, the missing-torch error) run everywhere.
"""
import json
import sys

import numpy as np
import pytest

from refbayes import cli, conformance
from refbayes._tolerances import EXACT_F64
from tests.reference.conv_loops import kfac_dense


def _by_name(report):
    return {r.quantity: r for r in report.rows}


@pytest.fixture(scope="module")
def laplace_report():
    pytest.importorskip("torch")
    pytest.importorskip("laplace")
    return conformance.get_report("laplace-torch").report()


@pytest.fixture(scope="module")
def ivon_report():
    pytest.importorskip("torch")
    pytest.importorskip("ivon")
    return conformance.get_report("ivon").report()


def test_import_does_not_import_torch():
    assert "refbayes.conformance" in sys.modules
    code = ("import sys, refbayes.conformance, refbayes.conformance.ivon, "
            "refbayes.conformance.laplace_torch; print('torch' in sys.modules)")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_list(capsys):
    assert cli.main(["conformance", "--list"]) == 0
    out = capsys.readouterr().out
    assert "laplace-torch" in out and "ivon" in out


def test_missing_torch_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert cli.main(["conformance", "laplace-torch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbayes: error:") and 'pip install "refbayes[conformance]"' in err
    assert "'torch'" in err


def test_exit_status_is_one_with_a_defect(laplace_report, monkeypatch, capsys):
    class Module:
        @staticmethod
        def report():
            return laplace_report
    monkeypatch.setattr(conformance, "get_report", lambda name: Module)
    assert cli.main(["conformance", "laplace-torch"]) == 1
    out = capsys.readouterr().out
    assert "defect" in out and "convention" in out and "agree" in out


def test_bad_name_and_no_name(capsys):
    assert cli.main(["conformance", "nope"]) == 2
    assert "expected one of laplace-torch, ivon" in capsys.readouterr().err
    assert cli.main(["conformance"]) == 2
    assert "NAME" in capsys.readouterr().err


def test_classify_rule():
    assert conformance.classify("q", 1e-12).verdict == "agree"
    assert conformance.classify("q", 1e-12, raw_error=1e-12).verdict == "agree"
    assert conformance.classify("q", 1e-12, raw_error=0.3, note="m").verdict == "convention"
    row = conformance.classify("q", 1e-3, decide=lambda: "library wrong")
    assert row.verdict == "defect" and row.note.startswith("library wrong")
    assert conformance.classify("q", 2 * EXACT_F64).verdict == "defect"


def test_torch_order_is_the_transposed_weight_layout():
    perm = conformance.torch_order([2, 3, 1])
    # layer 1: W (2, 3) row-major at 0..5, b at 6..8; torch weight (3, 2): W^T row-major
    assert list(perm[:9]) == [0, 3, 1, 4, 2, 5, 6, 7, 8]
    assert sorted(perm) == list(range(13))


def test_laplace_torch_verdicts(laplace_report):
    rows = _by_name(laplace_report)
    for subset in ("all", "last_layer"):
        for structure in ("full", "diag"):
            for key in ("precision", "log_det_ratio", "scatter", "log_lik", "lml", "f_mean",
                        "f_var"):
                assert rows[f"{subset}, {structure}, GGN: {key}"].verdict == "agree"
        for key in ("precision", "log_det_ratio", "lml", "f_var"):
            row = rows[f"{subset}, kron, GGN: {key}"]
            # the cross block makes a real raw difference, which the per-tensor mapping removes
            assert row.verdict == "convention" and row.raw_error > 1e-2
            assert row.error <= EXACT_F64 and "(laplace.22)" in row.note
    for key in ("precision", "log_det_ratio", "lml", "f_var"):
        assert rows[f"all, full, Hessian (CurvlinopsHessian): {key}"].verdict == "agree"
    for key in ("precision", "f_var"):
        assert rows[f"all, full, temperature 2: {key}"].verdict == "convention"
    for subset in ("all", "last_layer"):
        for key in ("precision", "log_det_ratio", "scatter", "log_lik", "lml", "f_mean", "f_var",
                    "probit"):
            assert rows[f"classification, {subset}, full, GGN: {key}"].verdict == "agree"
    # the probit link is a documented approximation of E[softmax(f*)], not a defect
    assert "documented approximation" in rows["classification, all, full, GGN: probit"].note
    # laplace-torch's MC link is right draw by draw once fed the draws it really uses
    assert rows["classification, all, full, GGN, MC link, S = 64, no generator "
                "(torch.manual_seed): probs"].verdict == "agree"
    # the cross-entropy is normalised: tempered classification is (1/T) log p, exactly
    for key in ("precision", "log_lik", "lml"):
        assert rows[f"classification, all, full, GGN, temperature 2: {key}"].verdict == "agree"
    # at T = 1 laplace-torch's evidence of Bayesian linear regression is the exact evidence
    for key in ("log_lik", "lml"):
        assert rows[f"linear-Gaussian (D = 4), full, temperature 1: {key}"].verdict == "agree"


def test_laplace_torch_defects_carry_their_evidence(laplace_report):
    defects = {r.quantity: r for r in laplace_report.defects}
    new = ({f"all, full, temperature 2: {k}" for k in ("log_lik", "lml")}
           | {f"linear-Gaussian (D = 4), full, temperature 2: {k}" for k in ("log_lik", "lml")}
           | {f"classification, all, full, GGN, {p}, S = 64, generator=: probs"
              for p in ("MC link", "NN predictive")}
           | {f"classification, {s}, kron, GGN, damping=True: {k}" for s in ("all", "last_layer")
              for k in ("precision", "log_det_ratio", "lml", "f_var")})
    assert set(defects) == {"all, full, EF (CurvlinopsEF): precision",
                            "all, full, EF (CurvlinopsEF): lml",
                            "all, full, GGN, torch default dtype float32: precision",
                            "all, full, GGN, torch default dtype float32: lml"} | new
    for name, row in defects.items():
        assert row.note.startswith("library wrong by dense" if name not in new else
                                   "library wrong by ")
        if name in new:  # what the documentation says, what it computes, the figures
            assert "documented:" in row.note and "computes:" in row.note
            assert "dense" in row.note and "library" in row.note
    ef = defects["all, full, EF (CurvlinopsEF): precision"]
    # refbayes equals the dense EF of the Gaussian NLL; laplace-torch is (2 / tau) times it
    assert "(2 / tau) H_refbayes" in ef.note and ef.error > 1.0
    assert 1e-9 < defects["all, full, GGN, torch default dtype float32: precision"].error < 1e-6


def test_laplace_torch_new_defect_figures(laplace_report):
    """The rows of issue 35 item 16 carry their sizes: temperature off by the untempered
    normaliser (+7.01 nats on N = 30, sigma = 1/4, T = 2), damping and generator ignored."""
    rows = _by_name(laplace_report)
    for name in ("all, full, temperature 2: lml",
                 "linear-Gaussian (D = 4), full, temperature 2: lml"):
        assert "library - dense +7.01" in rows[name].note
    assert rows["linear-Gaussian (D = 4), full, temperature 2: lml"].error > 1.0
    for subset in ("all", "last_layer"):
        row = rows[f"classification, {subset}, kron, GGN, damping=True: precision"]
        assert "(0.0e+00 apart" in row.note and row.error > 0.5
    row = rows["classification, all, full, GGN, MC link, S = 64, generator=: probs"]
    assert "global RNG" in row.note and row.error > 1e-2


def _lt_small(likelihood, structure="full", **kwargs):
    """A laplace-torch fit of a [2, 3, 3] tanh network on 12 random rows (no MAP needed: the
    signatures below are about which draws and which eigenvalues are used)."""
    import torch
    from laplace import Laplace
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 3, dtype=torch.float64), torch.nn.Tanh(),
                              torch.nn.Linear(3, 3 if likelihood == "classification" else 1,
                                              dtype=torch.float64))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    X = torch.randn(12, 2, generator=g, dtype=torch.float64)
    y = (torch.randint(0, 3, (12,), generator=g) if likelihood == "classification"
         else torch.randn(12, 1, generator=g, dtype=torch.float64))
    la = Laplace(net, likelihood, subset_of_weights="all", hessian_structure=structure, **kwargs)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=12))
    return la, X[:4]


def _torch_f64():
    torch = pytest.importorskip("torch")
    pytest.importorskip("laplace")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    return torch, previous


def test_laplace_torch_ignores_generator():
    """laplace-torch defect (derivations/laplace.md): `generator=` of `la(x, ...)` is checked
    and then not passed on; the draws come from torch's global RNG. This test asserts the
    defect's signature, so it FAILS WHEN UPSTREAM FIXES IT: then turn the report's generator
    rows into agreements and this test around."""
    torch, previous = _torch_f64()
    from refbayes.conformance.laplace_torch import _dense_glm_mc
    try:
        la, Xs = _lt_small("classification")
        S = 32

        def call(global_seed, gen_seed, **kw):
            torch.manual_seed(global_seed)
            return la(Xs, n_samples=S, generator=torch.Generator().manual_seed(gen_seed),
                      **kw).numpy()
        for kw in ({"link_approx": "mc"}, {"pred_type": "nn", "link_approx": "mc"}):
            # same generator seed, another global seed: another result
            assert np.max(np.abs(call(1, 0, **kw) - call(2, 0, **kw))) > 1e-3
            # another generator seed, the same global seed: bit for bit the same result
            np.testing.assert_array_equal(call(1, 0, **kw), call(1, 7, **kw))
        # dense: the MC link is the average over the GLOBAL draws, not the generator's
        f_mu, f_var = (t.numpy() for t in la._glm_predictive_distribution(Xs))
        torch.manual_seed(1)
        eps_global = torch.randn(3, S).numpy()
        eps_gen = torch.randn((3, S), generator=torch.Generator().manual_seed(0)).numpy()
        mc = call(1, 0, link_approx="mc")
        np.testing.assert_allclose(mc, _dense_glm_mc(f_mu, f_var, eps_global), rtol=EXACT_F64)
        assert np.max(np.abs(mc - _dense_glm_mc(f_mu, f_var, eps_gen))) > 1e-3
        # the regression sampling predictive ignores it as well
        la_r, Xr = _lt_small("regression")
        torch.manual_seed(1)
        a = la_r(Xr, pred_type="nn", link_approx="mc", n_samples=S,
                 generator=torch.Generator().manual_seed(0))[0].numpy()
        torch.manual_seed(2)
        b = la_r(Xr, pred_type="nn", link_approx="mc", n_samples=S,
                 generator=torch.Generator().manual_seed(0))[0].numpy()
        assert np.max(np.abs(a - b)) > 1e-3
    finally:
        torch.set_default_dtype(previous)


def test_laplace_torch_kron_damping_has_no_effect():
    """laplace-torch defect (derivations/laplace.md): KronLaplace(damping=True) returns
    damping=False's precision, log det, evidence and f_var bit for bit, because
    KronDecomposed.__mul__ / __add__ drop the flag; the damped precision built densely from its
    own factors differs. Asserts the defect's signature, so it FAILS WHEN UPSTREAM FIXES IT."""
    torch, previous = _torch_f64()
    from refbayes.conformance.laplace_torch import _kron_dense
    try:
        la1, Xs = _lt_small("classification", "kron", prior_precision=0.5, damping=True)
        la0, _ = _lt_small("classification", "kron", prior_precision=0.5, damping=False)
        assert la1.H.damping and not la1.posterior_precision.damping
        P1 = la1.posterior_precision.to_matrix().numpy()
        np.testing.assert_array_equal(P1, la0.posterior_precision.to_matrix().numpy())
        assert float(la1.log_marginal_likelihood()) == float(la0.log_marginal_likelihood())
        np.testing.assert_array_equal(la1(Xs).numpy(), la0(Xs).numpy())
        # the dense construction is right without damping, and damping would change P
        np.testing.assert_allclose(_kron_dense(la0, damping=False), P1, rtol=EXACT_F64,
                                   atol=EXACT_F64 * np.max(np.abs(P1)))
        P_damped = _kron_dense(la1, damping=True)
        assert np.max(np.abs(P_damped - P1)) > 1e-2 * np.max(np.abs(P1))
        # KronDecomposed's own damped eigenvalues, were the flag kept, give the dense damped P
        H = la1.H * la1._H_factor + la1.prior_precision
        H.damping = True
        np.testing.assert_allclose(H.to_matrix().numpy(), P_damped, rtol=EXACT_F64,
                                   atol=EXACT_F64 * np.max(np.abs(P_damped)))
        # last layer: the flag is already lost in the constructor (a second cause)
        from laplace import Laplace
        net = la1.model
        assert Laplace(net, "classification", subset_of_weights="last_layer",
                       hessian_structure="kron", damping=True).damping is False
    finally:
        torch.set_default_dtype(previous)


def test_laplace_torch_tempered_evidence_is_not_the_tempered_evidence():
    """laplace-torch defect (derivations/laplace.md): with temperature T its regression
    log_likelihood tempers the squared error but not the Gaussian normaliser, so on Bayesian
    linear regression (where the Laplace evidence at the tempered mode is exact) its evidence is
    the exact tempered evidence minus (1 - 1/T)(N / 2) log(2 pi sigma^2). Asserts the defect's
    signature, so it FAILS WHEN UPSTREAM FIXES IT."""
    torch, previous = _torch_f64()
    from laplace import Laplace

    from refbayes.conformance import laplace_torch as lt
    try:
        X, Xa, y = lt._linear_problem()
        N, D = Xa.shape
        sigma, delta = 0.25, 1.0
        for T in (1.0, 0.5, 2.0):
            P = Xa.T @ Xa / (sigma ** 2 * T) + delta * np.eye(D)
            w = np.linalg.solve(P, Xa.T @ y / (sigma ** 2 * T))
            net = torch.nn.Linear(D - 1, 1, dtype=torch.float64)
            with torch.no_grad():
                net.weight.copy_(torch.from_numpy(w[None, :-1].copy()))
                net.bias.copy_(torch.from_numpy(w[-1:].copy()))
            la = Laplace(net, "regression", subset_of_weights="all", hessian_structure="full",
                         prior_precision=delta, sigma_noise=sigma, temperature=T)
            la.fit(lt._loader(X, y))
            exact = lt.exact_tempered_log_evidence(Xa, y, sigma, delta, T)
            shift = -0.5 * N * (1.0 - 1.0 / T) * np.log(2 * np.pi * sigma ** 2)
            lml = float(la.log_marginal_likelihood())
            assert abs(lml - (exact + shift)) <= EXACT_F64 * abs(exact)
            if T != 1.0:
                assert abs(lml - exact) > 1.0
    finally:
        torch.set_default_dtype(previous)


def test_exact_tempered_log_evidence_by_quadrature():
    """The closed form the tempered-evidence rows are decided by, against adaptive quadrature of
    int prod_i N(y_i; w, sigma^2)^(1/T) N(w; 0, 1 / delta) dw (one parameter) and, at T = 1,
    against the Bayesian-linear-regression evidence of tests/reference."""
    # checks (laplace.24)
    from scipy.integrate import quad
    from scipy.stats import norm

    from refbayes._tolerances import QUADRATURE
    from refbayes.conformance.laplace_torch import (
        _linear_problem,
        exact_tempered_log_evidence,
    )
    from tests.reference.laplace_dense import blr_log_evidence
    X, Xa, y = _linear_problem()
    sigma, delta = 0.25, 2.0
    ones = np.ones((len(y), 1))
    for T in (0.5, 1.0, 2.0):
        def log_integrand(w, T=T):
            return np.sum(norm.logpdf(y, w, sigma)) / T + norm.logpdf(w, 0.0, delta ** -0.5)
        w_hat = (y.sum() / (sigma ** 2 * T)) / (len(y) / (sigma ** 2 * T) + delta)
        peak = log_integrand(w_hat)
        val, _ = quad(lambda w, peak=peak: np.exp(log_integrand(w) - peak), -np.inf, np.inf,
                      epsabs=0.0, epsrel=1e-13)
        expected = peak + np.log(val)
        got = exact_tempered_log_evidence(ones, y, sigma, delta, T)
        assert abs(got - expected) <= QUADRATURE * abs(expected)
    got = exact_tempered_log_evidence(Xa, y, sigma, delta, 1.0)
    expected = blr_log_evidence(X, y, sigma ** -2, np.full(Xa.shape[1], delta))
    assert abs(got - expected) <= EXACT_F64 * abs(expected)


def test_ivon_verdicts(ivon_report):
    rows = ivon_report.rows
    assert not ivon_report.defects
    for name in ("defaults", "gradsq", "beta1=0"):
        mine = [r for r in rows if r.quantity.startswith(name + ":")]
        assert len(mine) >= 5
        assert all(r.verdict == "agree" for r in mine if "VOGN" not in r.quantity)
    vogn_rows = [r for r in rows if "VOGN" in r.quantity]
    assert len(vogn_rows) == 4
    for r in vogn_rows:
        assert r.verdict == "convention" and r.raw_error > 1e-4 and "(vogn.19)" in r.note


def test_ivon_reference_step_reduces_to_vogn_by_hand():
    """(vogn.19) without torch: the NumPy IVON step with beta1 = 0 equals vogn's update."""
    from refbayes.conformance import ivon
    from refbayes.datasets.synthetic import make_logistic_regression
    from refbayes.methods import vogn
    from refbayes.models import MLP
    data = make_logistic_regression(32, 2, 1)
    model = MLP([2, 3, 1], activation="tanh", likelihood="bernoulli")
    rng = np.random.default_rng(3)
    cfg = ivon.IVONConfig(lr=0.2, ess=32, hess_init=0.3, beta1=0.0, beta2=0.6,
                          weight_decay=0.05)
    state = ivon.init(model.init_theta(rng, dtype=np.float64), cfg)
    for _ in range(3):
        eps = rng.standard_normal((model.D, 2))
        new, info = ivon.step(state, (data.X[:8], data.y[:8]), eps, cfg, model)
        c = vogn._scales(ivon.vogn_config(cfg), model.D, np.float64)
        vs = vogn.VOGNState(state.mu, state.h, np.zeros(model.D), state.t)
        v_new, v_info = vogn._update(vs, info.g_hat, ivon.vogn_curvature(state.h, info.f, cfg),
                                     c, vogn._sigma(state.h, c))
        np.testing.assert_allclose(vogn._sigma(state.h, c), info.sigma, rtol=EXACT_F64)
        np.testing.assert_allclose(v_new.s, new.h, rtol=EXACT_F64)
        np.testing.assert_allclose(v_new.mu, new.mu, rtol=EXACT_F64)
        np.testing.assert_allclose(v_info.m - c.delta_tilde * state.mu, new.m, rtol=EXACT_F64,
                                   atol=1e-15)
        state = new


def test_json_output(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("ivon")
    path = tmp_path / "rows.json"
    assert cli.main(["conformance", "ivon", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "quantity" in out and "verdict" in out
    data = json.loads(path.read_text())
    assert data["name"] == "ivon" and len(data["rows"]) == 19
    assert {r["verdict"] for r in data["rows"]} == {"agree", "convention"}


# ----------------------------------------------------------------------------- BackPACK, curvlinops

@pytest.fixture(scope="module")
def backpack_report():
    pytest.importorskip("torch")
    pytest.importorskip("backpack")
    return conformance.get_report("backpack").report()


@pytest.fixture(scope="module")
def curvlinops_report():
    pytest.importorskip("torch")
    pytest.importorskip("curvlinops")
    return conformance.get_report("curvlinops").report()


def test_cnn_reports_import_without_torch_and_are_listed(capsys):
    code = ("import sys, refbayes.conformance.backpack, refbayes.conformance.curvlinops; "
            "print('torch' in sys.modules, 'backpack' in sys.modules, "
            "'curvlinops' in sys.modules)")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
    assert cli.main(["conformance", "--list"]) == 0
    out = capsys.readouterr().out
    assert "backpack" in out and "curvlinops" in out


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_kfac_matmat_is_the_dense_kronecker_matrix(approx, separate):
    # checks (conv.24): the block products of the curvlinops report against numpy.kron
    from refbayes.conformance.curvlinops import kfac_matmat
    from refbayes.models import tiny_cnn
    model = tiny_cnn()
    rng = np.random.default_rng(0)
    theta = model.init_theta(rng)
    X = rng.standard_normal((4,) + tuple(model.input_shape))
    y = rng.integers(0, model.n_out, size=4)
    factors = model.kfac_curvature(theta, X, y, "ggn", approx)
    V = rng.standard_normal((model.D, 5))
    K = kfac_dense(model, factors, separate)
    assert conformance.rel_err(kfac_matmat(model, factors, V, separate=separate), K @ V) \
        <= EXACT_F64
    with pytest.raises(ValueError, match="V: expected"):
        kfac_matmat(model, factors, V[:-1])
    with pytest.raises(ValueError, match="factors: expected"):
        kfac_matmat(model, factors[:1], V)


def test_cnn_problem_refuses_bad_input():
    from refbayes.conformance.backpack import cnn_problem
    with pytest.raises(ValueError, match="name: expected one of tiny_cnn, lenet5"):
        cnn_problem("resnet")
    with pytest.raises(ValueError, match="M: expected an integer >= 1"):
        cnn_problem("tiny_cnn", 0)


def _check_cnn_report(report, n_rows, conventions):
    assert len(report.rows) == n_rows
    for row in report.rows:
        assert row.error <= EXACT_F64, row
        want = "convention" if any(c in row.quantity for c in conventions) else "agree"
        assert row.verdict == want, row
        if want == "convention":
            assert row.raw_error > 1e-3 and row.note, row
    assert not report.defects


def test_backpack_rows_agree(backpack_report):
    # BatchGrad, SumGradSquared, BatchL2Grad, DiagGGNExact at EXACT_F64; KFLR / KFAC a
    # convention on both nets (each has a conv layer): BackPACK's hybrid [B_reduce, P A_expand]
    _check_cnn_report(backpack_report, 12, ("KFLR", "KFAC"))
    names = _by_name(backpack_report)
    for net in ("tiny_cnn", "lenet5"):
        assert any(q.startswith(f"{net}: BatchGrad") for q in names)
        assert any(q.startswith(f"{net}: DiagGGNExact") for q in names)
        kflr = next(r for q, r in names.items() if q.startswith(f"{net}: KFLR"))
        assert "P A_expand" in kflr.note and "B_reduce" in kflr.note


CURVLINOPS_ROWS = 26  # per net: 4 type-2 K-FAC, 7 empirical / mc K-FAC, GGN, Hessian


def test_curvlinops_rows_agree(curvlinops_report):
    # K-FAC expand / reduce with factor 1; separate bias and mean reduction as conventions;
    # the empirical Fisher's and the MC Fisher's K-FAC (at curvlinops' own label draws) on the
    # Conv2d and the Linear layers; GGN and Hessian products, all at EXACT_F64 (no iterative
    # operator is compared)
    _check_cnn_report(curvlinops_report, CURVLINOPS_ROWS,
                      ("separate_weight_and_bias=True", "reduction=mean"))
    names = _by_name(curvlinops_report)
    for net in ("tiny_cnn", "lenet5"):
        for what in ("KFACLinearOperator expand, type-2", "KFACLinearOperator reduce, type-2",
                     "GGNLinearOperator", "HessianLinearOperator",
                     "KFACLinearOperator expand, empirical, Conv2d layers (conv.26)",
                     "KFACLinearOperator expand, empirical, Linear layers (conv.29)",
                     "KFACLinearOperator reduce, empirical, Conv2d layers (conv.27)",
                     "KFACLinearOperator expand, empirical, reduction=mean",
                     "KFACLinearOperator expand, mc, Conv2d layers (conv.26)",
                     "KFACLinearOperator expand, mc, Linear layers (conv.29)",
                     "KFACLinearOperator reduce, mc, Conv2d layers (conv.27)"):
            assert any(q.startswith(f"{net}: {what}") for q in names), (net, what)
    mean = [r for q, r in names.items() if "reduction=mean" in q]
    assert len(mean) == 4 and all("B / M" in r.note for r in mean)
    mc = [r for q, r in names.items() if ", mc, " in q]
    assert len(mc) == 6 and all("4 label draws" in r.note for r in mc)


@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_autograd_kfac_is_refbayes_ef_kfac(approx):
    # checks (conv.26) (conv.27) (conv.29): the dense check of the empirical / mc rows, torch
    # autograd's factors, against refbayes' "ef" factors, at the data's labels and averaged over
    # sampled ones
    pytest.importorskip("torch")
    from refbayes.conformance.backpack import cnn_problem
    from refbayes.conformance.curvlinops import autograd_kfac
    model, net, theta, X, y = cnn_problem("tiny_cnn")
    rng = np.random.default_rng(3)
    draws = [rng.integers(0, model.n_out, size=len(y)) for _ in range(3)]
    for labels in ([y], draws):
        theirs = autograd_kfac(net, X, labels, approx)
        per = [model.kfac_curvature(theta, X, lab, "ef", approx) for lab in labels]
        assert len(theirs) == len(per[0]) == 2
        for j, (A, B) in enumerate(theirs):
            assert conformance.rel_err(A, per[0][j][0]) <= EXACT_F64
            assert conformance.rel_err(B, sum(p[j][1] for p in per) / len(labels)) <= EXACT_F64
    with pytest.raises(ValueError, match="approx: expected"):
        autograd_kfac(net, X, [y], "kfc")
    with pytest.raises(ValueError, match="labels: expected at least one"):
        autograd_kfac(net, X, [], approx)


def test_mc_labels_are_curvlinops_draws():
    # the MC Fisher's K-FAC of curvlinops equals refbayes' "ef" K-FAC at mc_labels' draws, and
    # is far from it at the data's labels or at other draws: the rows are sensitive to the draws
    pytest.importorskip("torch")
    cl = pytest.importorskip("curvlinops")
    import torch

    from refbayes.conformance.backpack import cnn_problem
    from refbayes.conformance.curvlinops import kfac_matmat, mc_labels
    from refbayes.layout import to_refbayes
    model, net, theta, X, y = cnn_problem("tiny_cnn")
    op = cl.KFACLinearOperator(net, torch.nn.CrossEntropyLoss(reduction="sum"),
                               list(net.parameters()), [(torch.from_numpy(X), torch.from_numpy(y))],
                               fisher_type="mc", mc_samples=2, seed=7,
                               separate_weight_and_bias=False, check_deterministic=False)
    theirs = to_refbayes((op @ torch.eye(model.D, dtype=torch.float64)).numpy(), model,
                         "torch", axes=(0, 1))

    def ours(labels):
        per = [model.kfac_curvature(theta, X, lab, "ef") for lab in labels]
        factors = [(ps[0][0], sum(B for _, B in ps) / len(labels)) for ps in zip(*per)]
        return kfac_matmat(model, factors, np.eye(model.D))

    draws = mc_labels(net, X, 2, seed=7)
    assert len(draws) == 2 and all(d.shape == y.shape for d in draws)
    assert conformance.rel_err(ours(draws), theirs) <= EXACT_F64
    assert conformance.rel_err(ours([y]), theirs) > 1e-2
    assert conformance.rel_err(ours(mc_labels(net, X, 2, seed=8)), theirs) > 1e-2
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="n_samples: expected an integer >= 1"):
            mc_labels(net, X, bad)


def test_curvlinops_fisher_defect_is_decided_by_autograd(monkeypatch):
    # a library whose empirical / mc K-FAC were off by a factor 2 would be a defect on the
    # library's side, named by torch autograd's factors
    pytest.importorskip("torch")
    cl = pytest.importorskip("curvlinops")
    from refbayes.conformance import curvlinops as rc
    from refbayes.conformance.backpack import cnn_problem
    from refbayes.layout import from_refbayes

    real = cl.KFACLinearOperator

    class Doubled:
        def __init__(self, *args, **kwargs):
            self.op = real(*args, **kwargs)

        def __matmul__(self, V):
            return 2.0 * (self.op @ V)

    monkeypatch.setattr(cl, "KFACLinearOperator", Doubled)
    model, net, theta, X, y = cnn_problem("tiny_cnn")
    V = np.eye(model.D)
    rows = []
    rc._fisher_rows(rows, "tiny_cnn", model, net, theta, X, y, V,
                    from_refbayes(V, model, "torch", axes=(0,)))
    assert len(rows) == 7
    for row in rows:
        assert row.verdict == "defect", row
        if "reduction=mean" not in row.quantity:
            assert row.note.startswith("library wrong by torch autograd's K-FAC factors"), row


@pytest.mark.parametrize("name, module", [("backpack", "backpack"), ("curvlinops", "curvlinops")])
def test_cnn_reports_exit_zero(name, module, tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip(module)
    out = tmp_path / "rows.json"
    assert cli.main(["conformance", name, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["name"] == name and \
        len(payload["rows"]) == (12 if name == "backpack" else CURVLINOPS_ROWS)
    assert "0 defect" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["backpack", "curvlinops"])
def test_cnn_reports_exit_one_with_a_defect(name, monkeypatch, capsys):
    report = conformance.Report(name, "t", [conformance.classify("q", 0.0),
                                            conformance.classify("r", 1e-3)])

    class Module:
        @staticmethod
        def report():
            return report
    monkeypatch.setattr(conformance, "get_report", lambda n: Module)
    assert cli.main(["conformance", name]) == 1
    assert "defect" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["backpack", "curvlinops"])
def test_cnn_reports_missing_library_exit_two(name, monkeypatch, capsys):
    import importlib.util
    missing = name if importlib.util.find_spec("torch") is not None else "torch"
    monkeypatch.setitem(sys.modules, name, None)  # makes `import NAME` raise ImportError
    assert cli.main(["conformance", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbayes: error:") and 'pip install "refbayes[conformance]"' in err
    assert f"'{missing}'" in err
