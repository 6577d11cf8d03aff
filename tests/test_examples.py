"""examples/torch_verify.py: an independent PyTorch VOGN / SLANG verified against the golden traces.

The correct torch implementation must agree with every quantity of the committed traces
(``refbayes verify --layout torch``), and each planted bug must be caught at the equation it
breaks: VOGN's square-of-the-mean curvature at h_k (vogn.5), SLANG's missing prior gradient at
g_tilde (slang.5).
"""
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from refbayes import cli, tracing, verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torch_verify.py"
GOLDEN = ROOT / "tests" / "golden"

# method, trace file, the example's function, and where its planted bug must first show
CASES = {
    "vogn": ("vogn.npz", "vogn_steps", "h_k", "(vogn.5)", "derivations/vogn.md"),
    "slang": ("slang.npz", "slang_steps", "g_tilde", "(slang.5)", "derivations/slang.md"),
    "slang-mlp": ("slang-mlp.npz", "slang_steps", "g_tilde", "(slang.5)",
                  "derivations/slang.md"),
}


@functools.lru_cache(maxsize=None)
def _example():
    spec = importlib.util.spec_from_file_location("refbayes_example_torch_verify", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _trace(case):
    return tracing.load(GOLDEN / CASES[case][0])


@functools.lru_cache(maxsize=None)
def _dump(case, bug):
    return getattr(_example(), CASES[case][1])(_trace(case), bug=bug)


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_implementation_matches_every_quantity(case):
    trace = _trace(case)
    assert trace.options["steps"] == 2
    report = verify.compare(trace, _dump(case, False), layout="torch")
    assert report.ok, str(report)
    assert report.not_dumped == []
    assert report.ignored == []
    K = trace.options["steps"]
    assert len(report.rows) == K * len(trace.outputs)  # every quantity at every step compared


@pytest.mark.parametrize("case", sorted(CASES))
def test_planted_bug_is_caught_at_its_equation(case):
    _, _, name, tag, note = CASES[case]
    report = verify.compare(_trace(case), _dump(case, True), layout="torch")
    assert not report.ok
    bad = report.first_failure
    assert (bad.name, bad.step, bad.tag, bad.derivation, bad.status) == \
        (name, 1, tag, note, "diverges")
    assert bad.max_rel > 1e-3  # a real divergence, not rounding
    # everything the step computes before the broken equation still agrees
    before = report.rows[:report.rows.index(bad)]
    assert before and all(r.ok for r in before)


def test_torch_order_differs_from_refbayes_order():
    # the correct dump is in torch's order: read as refbayes' order it fails, with the hint
    report = verify.compare(_trace("vogn"), _dump("vogn", False))
    assert not report.ok
    assert "--layout torch" in report.first_failure.detail


@pytest.mark.parametrize("case", ["vogn", "slang"])
def test_cli_verify_names_the_first_divergence(case, tmp_path, capsys):
    trace_file, _, name, tag, note = CASES[case]
    good, bad = tmp_path / "mine.npz", tmp_path / "bug.npz"
    np.savez(good, **_dump(case, False))
    np.savez(bad, **_dump(case, True))
    capsys.readouterr()
    assert cli.main(["verify", str(GOLDEN / trace_file), str(good), "--layout", "torch"]) == 0
    out = capsys.readouterr().out
    assert "OK: every compared quantity agrees" in out
    assert cli.main(["verify", str(GOLDEN / trace_file), str(bad), "--layout", "torch"]) == 1
    out = capsys.readouterr().out
    assert "FIRST DIVERGENCE: step 1" in out
    assert f"{name} {tag}" in out and note in out


def test_script_entry_point(tmp_path):
    out = tmp_path / "mine.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "vogn", str(GOLDEN / "vogn.npz"), str(out),
                          "--bug"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "with the planted bug" in run.stdout
    report = verify.compare(GOLDEN / "vogn.npz", out, layout="torch")
    assert (report.first_failure.name, report.first_failure.tag) == ("h_k", "(vogn.5)")
    assert report.not_dumped == []
