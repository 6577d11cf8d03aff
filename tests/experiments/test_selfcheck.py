"""`refbayes reproduce selfcheck --quick` end to end: every check passes and its files are written."""
import json

import pytest

import refbayes
from refbayes.cli import main
from refbayes.datasets import make_logistic_regression
from refbayes.experiments import _runner


def test_selfcheck_quick_passes_and_writes_results(tmp_path, capsys):
    out = tmp_path / "sc"
    assert main(["reproduce", "selfcheck", "--quick", "--out", str(out)]) == 0
    result = json.loads((out / "selfcheck.json").read_text())
    checks = result["checks"]
    assert len(checks) == 15 and all(c["ok"] for c in checks)
    assert all(c["error"] <= c["tolerance"] for c in checks)
    assert (out / "selfcheck.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "rank-3: sample S S^T vs dense inverse" in printed and "NO" not in printed.split()
    # the problem the checks ran on heads the table (issue 35, item 6)
    assert printed.startswith("selfcheck: --quick problem: n = 200 rows, p = 10 features, MLP "
                              "width 20, rank L = 3, seed 0; deterministic")
    data = make_logistic_regression(200, 10, 0)  # the --quick problem, seed 0
    assert result["provenance"] == {"data_sha256": {"synthetic": _runner.sha256_arrays(data.X, data.y)},
                                    "refbayes_version": refbayes.__version__,
                                    "code_sha256": _runner.code_sha256(),
                                    "git_commit": _runner.git_commit()}
    assert result["complete"] is True  # every group in: the final file


def test_selfcheck_reports_a_failing_check(tmp_path, monkeypatch, capsys):
    """A wrong result must make the command fail, not print a green table."""
    from refbayes.experiments import selfcheck
    from refbayes.linalg import lowrank
    # a sampler with the wrong covariance (the identity) must be caught
    monkeypatch.setattr(lowrank, "sample", lambda mu, U, d, eps: mu[:, None] + eps)
    assert main(["reproduce", "selfcheck", "--quick", "--out", str(tmp_path)]) == 1
    assert "FAILED: 1 check(s): rank-3: sample S S^T vs dense inverse" in capsys.readouterr().err
    assert selfcheck.DESCRIPTION


def test_unwritable_out_is_an_error_before_any_check(tmp_path, monkeypatch, capsys):
    def refuse(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(_runner, "_probe", refuse)
    from refbayes.experiments import selfcheck
    monkeypatch.setattr(selfcheck, "_gradient_checks", lambda *a: pytest.fail("checked first"))
    assert main(["reproduce", "selfcheck", "--quick", "--out", str(tmp_path / "sc")]) == 2
    assert capsys.readouterr().err.startswith(
        f"refbayes: error: --out: cannot write in {tmp_path} (Permission denied)")
