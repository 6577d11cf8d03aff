"""examples/torch_verify.py: a PyTorch VOGN / SLANG / BBB / Adam verified against the golden traces.

The correct torch implementation must agree with every quantity of the committed traces
(``refbayes verify --layout torch``), and each planted bug must be caught at the equation it
breaks: VOGN's square-of-the-mean curvature at h_k (vogn.5), SLANG's missing prior gradient at
g_tilde (slang.5), BBB's KL sign at kl (bbb.7).
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

from refbayes import cli, layout, tracing, verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torch_verify.py"
GOLDEN = ROOT / "tests" / "golden"

# method, trace file, the example's function, and where its planted bug must first show
CASES = {
    "vogn": ("vogn.npz", "vogn_steps", "h_k", "(vogn.5)", "derivations/vogn.md"),
    "slang": ("slang.npz", "slang_steps", "g_tilde", "(slang.5)", "derivations/slang.md"),
    "slang-mlp": ("slang-mlp.npz", "slang_steps", "g_tilde", "(slang.5)",
                  "derivations/slang.md"),
    "bbb": ("bbb.npz", "bbb_steps", "kl", "(bbb.7)", "derivations/bbb.md"),
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


@pytest.mark.parametrize("case", ["vogn", "slang", "bbb"])
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


# ----------------------------------------------------------------------------- the tiny CNN
# The same script on the tiny-CNN traces (`refbayes trace METHOD --model tiny-cnn`,
# derivations/tracing.md "The tiny CNN"): a plain nn.Sequential Conv2d / ReLU / MaxPool2d /
# Flatten / Linear network, its parameters in torch's order (conv weight as is, Linear weight
# transposed). The trace's adam (MAP / Adam, torch.optim.Adam) on the MLP rides along.
CNN_CASES = {
    "vogn-cnn": ("vogn-cnn.npz", "vogn_steps", "h_k", "(vogn.5)", "derivations/vogn.md"),
    "adam-cnn": ("adam-cnn.npz", "adam_steps", "g_data", "(adam.5)", "derivations/bbb.md"),
    "slang-mlp-cnn": ("slang-mlp-cnn.npz", "slang_steps", "g_tilde", "(slang.5)",
                      "derivations/slang.md"),
    "adam": ("adam.npz", "adam_steps", "g_data", "(adam.5)", "derivations/bbb.md"),
    "bbb-cnn": ("bbb-cnn.npz", "bbb_steps", "kl", "(bbb.7)", "derivations/bbb.md"),
}


@functools.cache
def _cnn_trace(case):
    return tracing.load(GOLDEN / CNN_CASES[case][0])


@functools.cache
def _cnn_dump(case, bug):
    return getattr(_example(), CNN_CASES[case][1])(_cnn_trace(case), bug=bug)


def test_cnn_net_is_plain_torch_and_computes_refbayes_forward():
    trace = _cnn_trace("vogn-cnn")
    net = _example().make_net(trace.model)
    assert [type(m) for m in net] == [torch.nn.Conv2d, torch.nn.ReLU, torch.nn.MaxPool2d,
                                      torch.nn.Flatten, torch.nn.Linear]
    assert [tuple(p.shape) for p in net.parameters()] == [(2, 1, 3, 3), (2,), (3, 8), (3,)]
    model = tracing.model_from_spec(trace.model)
    theta = np.asarray(trace.inputs["input.state.mu"])
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(
            torch.from_numpy(layout.from_refbayes(theta, model, "torch").copy()),
            net.parameters())
        X = np.asarray(trace.inputs["input.batch.X"][0])
        f = net(torch.from_numpy(X).reshape(-1, 1, 6, 6)).numpy()
    np.testing.assert_allclose(f, model.forward(theta, X), rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_cnn_torch_implementation_matches_every_quantity(case):
    trace = _cnn_trace(case)
    assert trace.options["steps"] == 2
    assert trace.model["class"] == ("MLP" if case == "adam" else "CNN")
    report = verify.compare(trace, _cnn_dump(case, False), layout="torch")
    assert report.ok, str(report)
    assert report.not_dumped == [] and report.ignored == []
    assert len(report.rows) == trace.options["steps"] * len(trace.outputs)


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_cnn_planted_bug_is_caught_at_its_equation(case):
    _, _, name, tag, note = CNN_CASES[case]
    report = verify.compare(_cnn_trace(case), _cnn_dump(case, True), layout="torch")
    assert not report.ok
    bad = report.first_failure
    assert (bad.name, bad.step, bad.tag, bad.derivation, bad.status) == \
        (name, 1, tag, note, "diverges")
    assert bad.max_rel > 1e-3
    # adam's g_data is the step's first quantity: nothing before it (the others have some)
    assert all(r.ok for r in report.rows[:report.rows.index(bad)])


def test_cnn_transposed_linear_weight_is_a_layout_mistake():
    # a dump whose nn.Linear weight is flattened (n_in, n_out), refbayes' way, instead of
    # torch's (n_out, n_in): on the tiny CNN that is the whole refbayes order (the conv block is
    # the same in both), and verify says so at the first parameter-axis quantity
    trace = _cnn_trace("vogn-cnn")
    axes = {n: spec["param_axes"] for n, spec in trace.manifest["outputs"].items()}

    def transpose_linear(a, ax):
        a = np.moveaxis(np.array(a), ax, -1)
        w = a[..., 20:44].reshape(a.shape[:-1] + (3, 8))
        a[..., 20:44] = np.swapaxes(w, -1, -2).reshape(a.shape[:-1] + (24,))
        return np.moveaxis(a, -1, ax)

    dump = {n: transpose_linear(a, axes[n][0]) if axes[n] else a
            for n, a in _cnn_dump("vogn-cnn", False).items()}
    report = verify.compare(trace, dump, layout="torch")
    bad = report.first_failure
    assert (bad.name, bad.step, bad.tag) == ("sigma", 1, "(vogn.4)")
    assert "layout mistake" in bad.detail
    assert verify.compare(trace, dump).ok  # it is exactly refbayes' order


def test_cnn_script_and_cli(tmp_path, capsys):
    good, bad = tmp_path / "mine.npz", tmp_path / "bug.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for out, extra in ((good, []), (bad, ["--bug"])):
        run = subprocess.run([sys.executable, str(SCRIPT), "adam", str(GOLDEN / "adam-cnn.npz"),
                              str(out)] + extra, capture_output=True, text=True, env=env,
                             timeout=120, check=False)
        assert run.returncode == 0, run.stderr
    capsys.readouterr()
    trace = str(GOLDEN / "adam-cnn.npz")
    assert cli.main(["verify", trace, str(good), "--layout", "torch"]) == 0
    assert "OK: every compared quantity agrees (16 comparisons)" in capsys.readouterr().out
    assert cli.main(["verify", trace, str(bad), "--layout", "torch"]) == 1
    out = capsys.readouterr().out
    assert "FIRST DIVERGENCE: step 1, g_data (adam.5), derived in derivations/bbb.md" in out


def test_cnn_bad_model_and_trace_are_value_errors():
    ex = _example()
    spec = dict(_cnn_trace("vogn-cnn").model)
    spec["layers"] = spec["layers"][:1] + [{"type": "AvgPool2d", "kernel": [2, 2]}]
    with pytest.raises(ValueError, match="model: this example builds Conv2d"):
        ex.make_net(spec)
    with pytest.raises(ValueError, match="trace: expected an adam trace"):
        ex.adam_steps(_cnn_trace("vogn-cnn"))


# ----------------------------------------------------------------------------- BBB's [mu; rho]
# BBB's Adam moments and step run over [mu; rho] (2 D,): two theta-shaped blocks, each in torch's
# order in the dump (refbayes.layout's blocks=2).

@pytest.mark.parametrize("case", ["bbb", "bbb-cnn"])
def test_bbb_mu_rho_quantities_are_two_torch_ordered_blocks(case):
    trace = tracing.load(GOLDEN / f"{case}.npz")
    model = tracing.model_from_spec(trace.model)
    D = model.D
    dump = _example().bbb_steps(trace)
    for name in ("delta", "state.adam.m", "state.adam.v"):
        mine, ref = dump[name], np.asarray(trace.outputs[name])
        assert mine.shape == ref.shape == (2, 2 * D)
        # each D-block is the trace's block in torch's order; the whole the blocks=2 conversion
        for j in range(2):
            np.testing.assert_allclose(
                mine[:, j * D:(j + 1) * D],
                layout.from_refbayes(ref[:, j * D:(j + 1) * D], model, "torch"),
                rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(layout.to_refbayes(mine, model, "torch", blocks=2), ref,
                                   rtol=1e-12, atol=1e-14)
    # mu and rho are the two blocks of the new [mu; rho] minus the old one
    old = np.concatenate([np.asarray(trace.inputs["input.state.mu"]),
                          np.asarray(trace.inputs["input.state.rho"])])
    old = layout.from_refbayes(old, model, "torch", blocks=2)
    np.testing.assert_allclose(np.concatenate([dump["mu"][0], dump["rho"][0]]) - old,
                               dump["delta"][0], rtol=0, atol=1e-15)


def test_bbb_dump_read_in_refbayes_order_is_a_layout_mistake():
    # the torch dump without --layout torch: sigma passes (the trace starts from one rho in
    # every entry), theta, the first quantity that differs between the orders, is caught as a
    # layout mistake
    report = verify.compare(_trace("bbb"), _dump("bbb", False))
    bad = report.first_failure
    assert (bad.name, bad.step, bad.tag) == ("theta", 1, "(bbb.2)")
    assert "--layout torch" in bad.detail


def test_bbb_wrong_trace_is_a_value_error():
    with pytest.raises(ValueError, match="trace: expected a bbb trace"):
        _example().bbb_steps(_trace("vogn"))


def test_bbb_mu_rho_quantity_of_wrong_length_is_a_shape_row():
    # a [mu; rho] quantity whose length is neither the trace's 2 D nor D (one block left out)
    # is reported, under its own name, as a wrong shape; the others still compare
    dump = dict(_dump("bbb", False))
    D = tracing.model_from_spec(_trace("bbb").model).D
    dump["state.adam.v"] = dump["state.adam.v"][:, :D]
    report = verify.compare(_trace("bbb"), dump, layout="torch")
    bad = [r for r in report.rows if not r.ok]
    assert [(r.name, r.status) for r in bad] == [("state.adam.v", "shape")]
    assert f"expected shape (2, {2 * D})" in bad[0].detail
