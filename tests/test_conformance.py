"""`refbayes conformance`: laplace-torch and ivon-opt against refbayes on identical inputs.

The reports need torch and the library (the `conformance` extra) and skip without them; the CLI
tests (--list, the missing-torch error) run everywhere.
"""
import json
import sys

import numpy as np
import pytest

from refbayes import cli, conformance
from refbayes._tolerances import EXACT_F64


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
            assert row.error <= EXACT_F64 and "(laplace.24)" in row.note
    for key in ("precision", "log_det_ratio", "lml", "f_var"):
        assert rows[f"all, full, Hessian (CurvlinopsHessian): {key}"].verdict == "agree"
    for key in ("precision", "log_lik", "lml", "f_var"):
        assert rows[f"all, full, temperature 2: {key}"].verdict == "convention"


def test_laplace_torch_defects_carry_their_evidence(laplace_report):
    defects = {r.quantity: r for r in laplace_report.defects}
    assert set(defects) == {"all, full, EF (CurvlinopsEF): precision",
                            "all, full, EF (CurvlinopsEF): lml",
                            "all, full, GGN, torch default dtype float32: precision",
                            "all, full, GGN, torch default dtype float32: lml"}
    for row in defects.values():
        assert row.note.startswith("library wrong by dense autograd")
    ef = defects["all, full, EF (CurvlinopsEF): precision"]
    # refbayes equals the dense EF of the Gaussian NLL; laplace-torch is (2 / tau) times it
    assert "(2 / tau) H_refbayes" in ef.note and ef.error > 1.0
    assert 1e-9 < defects["all, full, GGN, torch default dtype float32: precision"].error < 1e-6


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
