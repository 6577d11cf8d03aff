"""Golden traces: the committed traces under tests/golden are rebuilt and must agree, so a silent
numerical change to any traced step fails here.

To bless an intended change: ``python -m refbayes.tracing tests/golden``, review ``git diff
--stat tests/golden``, and commit the files with the reason in the message.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from refbayes import __version__, layout, tracing, verify
from refbayes.cli import main as cli_main
from refbayes.methods import vogn
from refbayes.models import tiny_cnn
from refbayes.tracing.files import MANIFEST_KEY
from refbayes.tracing.steps import make_inputs, step
from refbayes.tracing.tags import LABEL
from refbayes.tracing.tracer import main
from tests.tolerances import EXACT_F64, assert_close, exact

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.npz"))
BLESS = "python -m refbayes.tracing tests/golden"


def test_every_method_has_a_committed_golden_trace():
    traced = {tracing.load(path).method for path in FILES}
    assert sorted(set(tracing.TRACERS) - traced) == []


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_committed_trace_is_reproduced(path):
    old = tracing.load(path)
    new = tracing.build(old.method, **old.options)
    assert list(new.outputs) == list(old.outputs), f"outputs changed; if intended: {BLESS}"
    assert sorted(new.inputs) == sorted(old.inputs), f"inputs changed; if intended: {BLESS}"
    # the manifest is what a user replicates the steps from: a config field added since the
    # trace was blessed must be listed in it too
    assert new.manifest["config"] == old.manifest["config"], f"config changed; if intended: {BLESS}"
    for name in (*old.inputs, *old.outputs):
        a = {**new.inputs, **new.outputs}[name]
        assert a.shape == {**old.inputs, **old.outputs}[name].shape, name
    report = verify.compare(old, {**new.inputs, **new.outputs},
                            rtol=exact(old.options["dtype"]))
    assert report.ok, f"{report}\nIf the change is intended: {BLESS}"
    assert report.not_dumped == [] and report.ignored == []


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_manifest_sidecar_equals_the_embedded_one(path):
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    trace = tracing.load(path)
    assert sidecar == trace.manifest
    assert sidecar["format"] == tracing.FORMAT
    assert sidecar["format_version"] == tracing.FORMAT_VERSION
    assert sidecar["command"].startswith(f"refbayes trace {trace.method} --seed ")
    assert Path(__file__).parents[1].joinpath(sidecar["derivation"]).is_file()


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_float_output_is_tagged_with_an_existing_equation(path):
    trace = tracing.load(path)
    root = Path(__file__).parents[1]
    for name, a in trace.outputs.items():
        tag = trace.tags[name]
        if a.dtype.kind == "f":  # step counters (state.t) are the only untagged outputs
            assert tag, name
        note = root / tracing.derivation_of(tag, trace.manifest["derivation"])
        assert note.is_file(), (name, tag)
        for label in LABEL.findall(tag):
            assert f"({label})" in note.read_text(), (name, label)


def test_the_npz_holds_no_object_arrays():
    for path in FILES:
        with np.load(path, allow_pickle=False) as npz:  # raises on a pickled entry
            assert all(npz[k].dtype.kind in "biufU" for k in npz.files)


def test_a_chained_trace_extends_its_prefix():
    two = tracing.build("vadam", steps=2)
    three = tracing.build("vadam", steps=3)
    for name, a in two.outputs.items():
        np.testing.assert_array_equal(three.outputs[name][:2], a)


def test_step_one_is_the_printed_trace_step():
    """The chained slang trace's first step is `refbayes trace slang`'s step, draws included."""
    inputs = make_inputs("slang", seed=4)
    info = step(inputs)[1]
    chained = tracing.build("slang", seed=4, steps=2)
    np.testing.assert_array_equal(chained.inputs["input.eps"][0], inputs.eps)
    np.testing.assert_array_equal(chained.inputs["input.batch.idx"][0], inputs.idx)
    for field in info._fields:
        np.testing.assert_array_equal(chained.outputs[field][0], np.asarray(getattr(info, field)))


def test_a_driver_trace_equals_direct_calls_of_the_step():
    """vogn: the trace's outputs are vogn.step on the trace's own inputs, step after step."""
    t = tracing.build("vogn", steps=3)
    model = tracing.model_from_spec(t.model)
    state = vogn.VOGNState(*(t.inputs[f"input.state.{f}"] for f in vogn.VOGNState._fields))
    state = state._replace(t=int(state.t))
    cfg = vogn.VOGNConfig(**t.config)  # delta is a scalar here: no input.cfg arrays
    from refbayes.methods._estimates import Batch
    for k in range(3):
        batch = Batch(t.inputs["input.batch.X"][k], t.inputs["input.batch.y"][k])
        state, info = vogn.step(state, batch, t.inputs["input.eps"][k], cfg, model)
        for field in info._fields:
            assert_close(np.asarray(getattr(info, field)), t.outputs[field][k], EXACT_F64,
                         f"step {k + 1} {field}")


def test_float32_trace_runs_in_float32_and_measures_the_condition():
    t = tracing.build("bbb", steps=1, dtype="float32")
    assert all(a.dtype == np.float32 for n, a in t.outputs.items() if a.dtype.kind == "f")
    assert all(t.condition[n] >= 1.0 for n, a in t.outputs.items() if a.dtype.kind == "f")
    t64 = tracing.build("bbb", steps=1)
    assert t64.condition == t.condition  # one measurement: the same two runs


@pytest.mark.parametrize("method, kwargs, message", [
    ("nosuch", {}, "method: expected one of"),
    ("laplace", {"steps": 2}, "steps: laplace is traced as one fit; expected 1, got 2"),
    ("laplace", {"dtype": "float32"}, "dtype: laplace is traced in float64 only"),
    ("vogn", {"dtype": "float16"}, "dtype: expected one of float64, float32"),
    ("vogn", {"L": 2}, "options: vogn takes M, S, curvature, got L"),
    ("vogn", {"steps": 0}, "steps"),
    ("vogn", {"seed": -1}, "seed"),
])
def test_build_refuses_bad_arguments(method, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tracing.build(method, **kwargs)


def test_save_and_load_refuse_what_they_cannot_write_or_read(tmp_path):
    trace = tracing.build("adam")
    with pytest.raises(ValueError, match="path: expected a file name ending in .npz"):
        tracing.save(trace, tmp_path / "x.npy")
    with pytest.raises(FileNotFoundError, match="path: the folder"):
        tracing.save(trace, tmp_path / "no" / "x.npz")
    with pytest.raises(FileNotFoundError, match="trace: no file"):
        tracing.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="no __manifest__ entry; it is not a golden trace"):
        tracing.load(tmp_path / "plain.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="is not a readable npz file"):
        tracing.load(tmp_path / "junk.npz")


def _rewrite_manifest(src: Path, dst: Path, **changes) -> Path:
    with np.load(src, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    manifest = json.loads(str(arrays[MANIFEST_KEY]))
    manifest.update(changes)
    arrays[MANIFEST_KEY] = np.array(json.dumps(manifest))
    np.savez(dst, **arrays)
    return dst


def test_load_refuses_another_format_version_and_names_the_rebuild_command(tmp_path):
    path = _rewrite_manifest(GOLDEN / "adam.npz", tmp_path / "v2.npz",
                             format_version=tracing.FORMAT_VERSION + 1)
    with pytest.raises(ValueError, match="format version 3, this refbayes .* reads version 2 "
                                         "only .*re-run `refbayes trace` to rebuild it: "
                                         "refbayes trace adam"):
        tracing.load(path)


def test_a_version_1_trace_is_refused_by_verify_and_rebuilt_by_bless(tmp_path, capsys):
    """Format version 2 renamed inputs (input.batch.*, input.cfg.*): a version-1 trace is
    refused with the command that rebuilds it, and bless rebuilds it from its own options."""
    path = _rewrite_manifest(GOLDEN / "adam.npz", tmp_path / "v1.npz", format_version=1)
    assert cli_main(["verify", str(path), str(GOLDEN / "adam.npz")]) == 2
    err = capsys.readouterr().err
    assert "format version 1" in err and "re-run `refbayes trace` to rebuild it: " \
        "refbayes trace adam --seed 0 --steps 2" in err
    tracing.bless(tmp_path)
    rebuilt = tracing.load(path)
    assert rebuilt.manifest["format_version"] == tracing.FORMAT_VERSION == 2
    assert rebuilt.options == tracing.load(GOLDEN / "adam.npz").options


def test_load_refuses_arrays_that_disagree_with_the_manifest(tmp_path):
    with np.load(GOLDEN / "adam.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["theta"] = arrays["theta"][:, :3]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"theta has shape \(2, 3\), its manifest says \(2, 34\)"):
        tracing.load(tmp_path / "bad.npz")
    del arrays["theta"]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="lacks the array 'theta' of its manifest"):
        tracing.load(tmp_path / "bad.npz")


def test_bless_rewrites_each_trace_from_its_own_options(tmp_path):
    for name in ("adam", "vogn-float32"):
        for suffix in (".npz", ".npz.json"):
            (tmp_path / (name + suffix)).write_bytes((GOLDEN / (name + suffix)).read_bytes())
    stale = _rewrite_manifest(tmp_path / "adam.npz", tmp_path / "adam.npz", command="stale")
    assert tracing.load(stale).manifest["command"] == "stale"
    assert main([str(tmp_path)]) == 0
    blessed = tracing.load(tmp_path / "adam.npz")
    assert blessed.manifest["command"].startswith("refbayes trace adam")
    assert tracing.load(tmp_path / "vogn-float32.npz").options["dtype"] == "float32"
    with pytest.raises(FileNotFoundError, match="no \\*.npz golden traces"):
        tracing.bless(tmp_path / "empty")


def test_the_bless_hint_names_the_module_that_blesses():
    """BLESS runs ``refbayes.tracing.__main__``, which calls the ``main`` tested above."""
    module, folder = BLESS.split()[2:]
    assert module == "refbayes.tracing" and (Path(__file__).parents[1] / folder) == GOLDEN
    spec = importlib.util.find_spec(f"{module}.__main__")
    assert spec is not None and "from refbayes.tracing.tracer import main" in \
        Path(spec.origin).read_text()


def test_field_tags_read_the_info_comments():
    tags = tracing.field_tags(vogn.VOGNInfo)
    assert tags["g_hat"] == "(vogn.5), (vogn.6)" and tags["mu"] == "(vogn.9)"
    assert tracing.derivation_of("(bbb.4)", "x") == "derivations/bbb.md"
    assert tracing.derivation_of("", "derivations/x.md") == "derivations/x.md"


def test_the_manifest_records_the_version_and_parameter_axes():
    t = tracing.build("vogn")
    assert t.manifest["refbayes_version"] == __version__
    assert t.param_axes["g_k"] == (2,) and t.param_axes["theta"] == (1,)
    assert t.param_axes["input.state.mu"] == (0,) and t.param_axes["N_eff"] == ()
    assert t.param_axes["input.eps"] == (1,) and "input.eps" in t.per_step
    # every numeric config field is an input too (0-d), the strings only in the manifest
    assert t.inputs["input.cfg.delta"].shape == () and t.config["delta"] == 1.0
    assert t.config["curvature"] == "ef" and not any("curvature" in n for n in t.inputs)
    assert tracing.model_from_spec(t.model).D == 34
    with pytest.raises(ValueError, match="model: cannot rebuild"):
        tracing.model_from_spec({"class": "Nope", "repr": "Nope()"})


# ----------------------------------------------------------------- the tiny-CNN traces (issue 34)
CNN_FILES = sorted(GOLDEN.glob("*-cnn.npz"))
# BBB's [mu; rho] quantities: two D-blocks on their last axis (refbayes.verify reads each block
# in the dump's layout)
MU_RHO = ("delta", "state.adam.m", "state.adam.v", "input.state.adam.m", "input.state.adam.v")


def test_every_method_traced_on_the_tiny_cnn_has_a_committed_cnn_trace():
    on_cnn = {name for name, t in tracing.TRACERS.items() if "tiny-cnn" in t.models}
    assert {"adam", "vogn", "bbb", "swag", "noisy-kfac"} <= on_cnn
    committed = {tracing.load(p).method for p in CNN_FILES}
    assert committed == on_cnn
    for path in CNN_FILES:
        trace = tracing.load(path)
        assert path.name == f"{trace.method}-cnn.npz" and trace.options["model"] == "tiny-cnn"
        assert "--model tiny-cnn" in trace.manifest["command"]


@pytest.mark.parametrize("path", CNN_FILES, ids=[p.stem for p in CNN_FILES])
def test_a_cnn_trace_rebuilds_the_tiny_cnn_from_its_spec(path):
    trace = tracing.load(path)
    model = tracing.model_from_spec(trace.model)
    assert model == tiny_cnn() and model.D == trace.model["D"] == 47
    assert trace.model["class"] == "CNN" and trace.model["input_shape"] == [1, 6, 6]
    assert [layer["type"] for layer in trace.model["layers"]] == \
        ["Conv2d", "Activation", "MaxPool2d", "Flatten", "Dense"]
    assert trace.inputs["input.batch.X"].shape[-1] == 36  # rows: 1x6x6 images flattened
    assert trace.param_axes["input.state." + ("theta" if "input.state.theta" in trace.inputs
                                               else "mu")] == (0,)


def _layout_dump(trace, model, order):
    """Every input and output of the trace with its parameter axes in a framework's order."""
    D = model.D
    dump = {}
    for name, a in {**trace.inputs, **trace.outputs}.items():
        axes = trace.param_axes.get(name, ())
        if axes:
            a = layout.from_refbayes(a, model, order, axes=axes)
        elif name in MU_RHO and a.ndim and a.shape[-1] == 2 * D:
            a = np.concatenate([layout.from_refbayes(a[..., :D], model, order),
                                layout.from_refbayes(a[..., D:], model, order)], axis=-1)
        dump[name] = a
    return dump


@pytest.mark.parametrize("path", CNN_FILES, ids=[p.stem for p in CNN_FILES])
def test_verify_accepts_a_dump_of_a_cnn_trace_in_every_layout(path, tmp_path, capsys):
    trace = tracing.load(path)
    model = tracing.model_from_spec(trace.model)
    mine = tmp_path / "mine.npz"
    np.savez(mine, **trace.inputs, **trace.outputs)
    assert cli_main(["verify", str(path), str(mine)]) == 0
    theta = "input.state.theta" if "input.state.theta" in trace.inputs else "input.state.mu"
    for order in ("torch", "flax"):
        dump = _layout_dump(trace, model, order)
        # torch: the dense weight transposed; flax: the conv kernel and the flatten order too
        assert not np.array_equal(dump[theta], trace.inputs[theta])
        np.savez(tmp_path / f"{order}.npz", **dump)
        assert cli_main(["verify", str(path), str(tmp_path / f"{order}.npz"), "--layout",
                         order]) == 0
        capsys.readouterr()
        report = verify.compare(trace, dump, layout=order)
        assert report.ok and report.not_dumped == [], str(report)
        # read in refbayes order, the dump diverges at a layout mistake that names the layout
        bad = verify.compare(trace, dump).first_failure
        assert bad is not None and order in bad.detail


def test_a_torch_cnn_reproduces_the_adam_cnn_trace_in_torch_layout(tmp_path):
    """An independent torch nn.Sequential of the tiny CNN, its parameters the trace's start read
    in the torch layout, computes g_data = (N / M) sum_B grad l_i (adam.5) of step 1, and
    ``refbayes verify --layout torch`` accepts it: the CNN trace's torch layout is torch's own
    ``parameters()`` order."""
    torch = pytest.importorskip("torch")
    trace = tracing.load(GOLDEN / "adam-cnn.npz")
    model = tracing.model_from_spec(trace.model)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Flatten(), torch.nn.Linear(8, 3)).double()
    theta = layout.from_refbayes(trace.inputs["input.state.theta"], model, "torch")
    torch.nn.utils.vector_to_parameters(torch.from_numpy(theta.copy()), net.parameters())
    X = torch.from_numpy(trace.inputs["input.batch.X"][0].reshape(-1, 1, 6, 6))
    y = torch.from_numpy(trace.inputs["input.batch.y"][0])
    loss = torch.nn.functional.cross_entropy(net(X), y, reduction="sum")
    grads = torch.autograd.grad(loss, list(net.parameters()))
    N, M = int(trace.inputs["input.cfg.N"]), X.shape[0]
    g_data = (N / M) * torch.cat([g.reshape(-1) for g in grads]).numpy()
    np.savez(tmp_path / "torch.npz", **{"input.state.theta": theta, "g_data": g_data})
    report = verify.compare(trace, tmp_path / "torch.npz", layout="torch")
    assert report.ok, str(report)
    assert not verify.compare(trace, tmp_path / "torch.npz").ok  # the dense weight transposed
    assert cli_main(["verify", str(GOLDEN / "adam-cnn.npz"), str(tmp_path / "torch.npz"),
                     "--layout", "torch"]) == 0
