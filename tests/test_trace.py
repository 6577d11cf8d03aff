"""`refbayes trace METHOD` and ``refbayes.tracing``: the equation tags read off the field comments,
the one printed form (``format_trace``) and the one JSON form (``to_json``) of every trace, and the
traced outputs against direct calls of the library on the trace's own inputs."""
import ast
import functools
import importlib
import inspect
import io
import itertools
import json
import pkgutil
import re
import textwrap
import tokenize
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import scipy.linalg
from scipy.stats import multivariate_normal

import refbayes.methods
import refbayes.tracing
from refbayes import verify
from refbayes.cli import main
from refbayes.datasets import make_logistic_regression
from refbayes.linalg import kron
from refbayes.methods import (
    ktied,
    laplace,
    ngvi,
    noisy_kfac,
    riemannian_laplace,
    slang,
    swag,
    vogn,
)
from refbayes.methods._estimates import Batch
from refbayes.methods.adam import AdamState
from refbayes.models import MLP, LogisticRegression, lenet5, tiny_cnn
from refbayes.tracing import (
    FORMAT_VERSION,
    NOTE_OF,
    TRACERS,
    build,
    derivation_of,
    field_tags,
    format_trace,
    load,
    model_from_spec,
    model_spec,
    to_json,
)
from refbayes.tracing.kfac import NoisyKFACTraceInfo, make_noisy_kfac_inputs
from refbayes.tracing.ktied import KT_JITTER, KT_SIGMA0, make_ktied_inputs
from refbayes.tracing.laplace import (
    LaplaceInfo,
    RiemannianLaplaceInfo,
    make_laplace_inputs,
)
from refbayes.tracing.printing import SHOW_ALL, SHOW_FIRST
from refbayes.tracing.problems import (
    MAP_GTOL,
    MEAN_SCALE,
    cnn_problem,
    find_map,
    ktied_problem,
    regression_problem,
    shipped_map,
)
from refbayes.tracing.steps import make_inputs, step
from refbayes.tracing.swag import SWAGTraceInfo, make_swag_inputs
from refbayes.tracing.tags import LABEL
from refbayes.tracing.tracer import CONDITION_RULES
from tests.test_trace_tags import ROOT, _labels
from tests.tolerances import EXACT_F64, ODE_F64, assert_close

METHODS = list(TRACERS)  # every traced method, in the order `refbayes trace` lists them
INFO = {"slang": slang.SLANGInfo, "ngvi-full": ngvi.FullInfo, "ngvi-meanfield": ngvi.MeanFieldInfo,
        "laplace": LaplaceInfo, "riemannian-laplace": RiemannianLaplaceInfo,
        "swag": SWAGTraceInfo, "noisy-kfac": NoisyKFACTraceInfo, "kfac": NoisyKFACTraceInfo,
        "ktied": ktied.KTiedInfo}
STATE = {"slang": slang.SLANGState, "ngvi-full": ngvi.FullState,
         "ngvi-meanfield": ngvi.MeanFieldState, "ktied": ktied.KTiedState,
         "noisy-kfac": noisy_kfac.NoisyKFACState, "kfac": noisy_kfac.NoisyKFACState}


@functools.cache
def _built(method, **options):
    """build(method, **options), once per session (the tests only read it)."""
    return build(method, **options)


def _head(name: str) -> str:
    """The Info field an output comes from: 'A_hat.0' -> 'A_hat'."""
    return name.split(".")[0]


# ----------------------------------------------------------------------------- the tags

TAG_EXPR = re.compile(r"\(\w+\.\d+\)(?:\s*[-/]\s*\(\w+\.\d+\))*")


def _field_comments(cls) -> dict:
    """{field: its trailing comment} of a NamedTuple class, read with tokenize and ast (a parser
    independent of field_tags' regular expression)."""
    src = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: tok.string
                for tok in tokenize.generate_tokens(io.StringIO(src).readline)
                if tok.type == tokenize.COMMENT}
    body = ast.parse(src).body[0].body
    return {node.target.id: comments.get(node.lineno, "")
            for node in body if isinstance(node, ast.AnnAssign)}


def _comment_tags(cls) -> dict:
    """{field: the tag expressions of its comment, joined by ', '}."""
    return {f: ", ".join(TAG_EXPR.findall(c)) for f, c in _field_comments(cls).items()}


def _info_and_state_classes() -> list:
    """Every State / Info NamedTuple of refbayes.methods and refbayes.tracing."""
    found = []
    for package in (refbayes.methods, refbayes.tracing):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name == "__main__":
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, cls in vars(module).items():
                if (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")
                        and cls.__module__ == module.__name__
                        and name.endswith(("Info", "State"))):
                    found.append(cls)
    return found


CLASSES = _info_and_state_classes()


@pytest.mark.parametrize("cls", CLASSES, ids=[f"{c.__module__}.{c.__name__}" for c in CLASSES])
def test_field_tags_give_every_field_the_tag_expressions_of_its_comment(cls):
    assert list(_field_comments(cls)) == list(cls._fields)  # every field is an annotated line
    assert field_tags(cls) == _comment_tags(cls)


def test_the_sweep_finds_the_traced_info_classes():
    assert len(CLASSES) > 20, "found almost no State / Info classes: the sweep is stale"
    for cls in {*INFO.values(), *STATE.values()}:
        assert cls in CLASSES, cls.__name__
        assert any(field_tags(cls).values()), f"{cls.__name__}: no field is tagged"


class _TaggedInfo(NamedTuple):
    C_hat: object  # (D, D)  (ngvi.9)-(ngvi.11)
    g_hat: object  # (D,)  (ngvi.8) / (ngvi.11)
    h_hat: object  # ghat, (D,) (vogn.5), (vogn.6)
    delta: object  # (ngvi.12); delta = 1 - beta_t is line 2
    plain: object  # a comment naming no equation
    bare: object


class _DriftedInfo(NamedTuple):
    W: object  # line 7 input: (D, L + M S)  (slang.3)
    U: object  # lines 7, 9: U_{t+1}, (D, L)  (slang.2)


def test_field_tags_read_ranges_alternatives_and_lists():
    assert field_tags(_TaggedInfo) == {
        "C_hat": "(ngvi.9)-(ngvi.11)", "g_hat": "(ngvi.8) / (ngvi.11)",
        "h_hat": "(vogn.5), (vogn.6)", "delta": "(ngvi.12)", "plain": "", "bare": ""}


def test_the_tag_is_the_comment_so_it_cannot_drift():
    """No table restates the tags: the comment's tag is the traced tag (a comment naming (slang.3)
    gives (slang.3), whatever another source says)."""
    assert field_tags(_DriftedInfo) == {"W": "(slang.3)", "U": "(slang.2)"}


@pytest.mark.parametrize("method", INFO)
def test_the_traced_tags_are_the_info_and_state_comments(method):
    t = _built(method)
    info = field_tags(INFO[method])
    state = field_tags(STATE[method]) if method in STATE else {}
    assert [n for n in t.outputs if not n.startswith("state.")] == [
        n for n in t.outputs if _head(n) in INFO[method]._fields]
    for name in t.outputs:
        if name.startswith("state."):
            assert t.tags[name] == state[name.split(".")[1]], name
        else:
            assert t.tags[name] == info[_head(name)], name
    for name in t.inputs:
        if name.startswith("input.state.") and state:
            assert t.tags[name] == state[name.split(".")[2]], name


@pytest.mark.parametrize("method", METHODS)
def test_every_traced_output_tag_names_an_equation_of_its_derivation_note(method):
    t = _built(method)
    assert (ROOT / t.manifest["derivation"]).is_file()
    for name, a in t.outputs.items():
        tag = t.tags[name]
        assert t.manifest["outputs"][name]["tag"] == tag
        if a.dtype.kind == "f":  # counters (state.t, nfev) may be untagged; no float is
            assert tag, name
        assert TAG_EXPR.fullmatch(tag.replace(", ", " / ")) or tag == "", (name, tag)
        for label in LABEL.findall(tag):
            prefix, n = label.split(".")
            note = ROOT / derivation_of(f"({label})", t.manifest["derivation"])
            assert note == ROOT / "derivations" / f"{NOTE_OF.get(prefix, prefix)}.md"
            assert note.is_file(), (name, label)
            assert (prefix, int(n)) in _labels(note), f"{name}: ({label}) not numbered in {note}"


# Outputs of the Laplace, SWAG, K-FAC and k-tied traces that are also fields of a library
# NamedTuple: the trace's tag must be one of the tags the library's own trailing comment gives it.
LIBRARY_FIELDS = {
    ("laplace", "precision"): [(laplace.LaplaceState, "Sigma_inv"),
                               (laplace.LaplaceState, "prec_diag")],
    ("laplace", "f_mean"): [(laplace.GLMPredictive, "f_mean")],
    ("laplace", "f_var"): [(laplace.GLMPredictive, "f_var")],
    ("laplace", "y_var"): [(laplace.GLMPredictive, "y_var")],
    ("riemannian-laplace", "precision"): [(laplace.LaplaceState, "Sigma_inv"),
                                          (laplace.LaplaceState, "prec_diag")],
    ("riemannian-laplace", "c"): [(riemannian_laplace.ExpMapInfo, "c")],
    ("riemannian-laplace", "cdot"): [(riemannian_laplace.ExpMapInfo, "cdot"),
                                     (riemannian_laplace.SampleInfo, "cdot")],
    **{("swag", f): [(swag.SGDInfo, f)] for f in swag.SGDInfo._fields},
    **{("swag", f): [(swag.SWAGInfo, f)] for f in swag.SWAGInfo._fields},
    ("swag", "D_hat"): [(swag.SWAGState, "D_hat")],
    **{(m, f): [(noisy_kfac.NoisyKFACInfo, f)] for m in ("noisy-kfac", "kfac")
       for f in noisy_kfac.NoisyKFACInfo._fields},
    **{(m, f): [(noisy_kfac.NoisyKFACState, f)] for m in ("noisy-kfac", "kfac")
       for f in ("A", "S")},
    **{("ktied", f): [(ktied.KTiedInfo, f)] for f in ktied.KTiedInfo._fields},
    # the new Adam moments are traced as the state's adam field, tagged by its comment
    ("ktied", "state.adam.m"): [(ktied.KTiedState, "adam")],
    ("ktied", "state.adam.v"): [(ktied.KTiedState, "adam")],
}


@pytest.mark.parametrize("method, field", sorted(LIBRARY_FIELDS))
def test_trace_tags_agree_with_the_library_comments(method, field):
    t = _built(method)
    names = [n for n in t.outputs if n == field or (_head(n) == field and "." in n
                                                   and not n.startswith("state."))]
    assert names, (method, field)
    for name in names:
        tag = t.tags[name]
        for cls, lib in LIBRARY_FIELDS[(method, field)]:
            library_tags = TAG_EXPR.findall(_field_comments(cls)[lib])
            assert tag in library_tags, (cls.__name__, lib, library_tags, name, tag)


def test_the_swag_trace_steps_are_the_library_info_fields():
    """SWAGTraceInfo opens with SGDInfo's fields, then SWAGInfo's, stacked over the steps: a
    field renamed or added in swag.py shows up here (and in the tag checks above)."""
    per_step = swag.SGDInfo._fields + swag.SWAGInfo._fields
    assert SWAGTraceInfo._fields[:len(per_step)] == per_step
    assert list(_built("swag").outputs) == list(SWAGTraceInfo._fields)


def test_the_noisy_kfac_trace_is_pi_the_library_info_and_the_new_factors():
    """NoisyKFACTraceInfo is pi, then every NoisyKFACInfo field in its order, then the state's new
    A and S: a field renamed or added in noisy_kfac.py shows up here (and in the tag checks)."""
    assert NoisyKFACTraceInfo._fields == ("pi", *noisy_kfac.NoisyKFACInfo._fields, "A", "S")
    nk, kf = _built("noisy-kfac"), _built("kfac")
    assert list(dict.fromkeys(map(_head, nk.outputs))) == [*NoisyKFACTraceInfo._fields, "state"]
    assert [n for n in nk.outputs if n.startswith("state.")] == [
        "state.A_ref.0", "state.A_ref.1", "state.S_ref.0", "state.S_ref.1", "state.t"]
    assert kf.tags == nk.tags and list(kf.outputs) == list(nk.outputs)


def test_the_ktied_trace_is_the_library_info_and_the_new_state():
    """The k-tied trace is every KTiedInfo field in its order, then the new state's fields that
    KTiedInfo does not hold: its Adam moments and counters and the ranks k."""
    t = _built("ktied")
    assert list(t.outputs) == [*ktied.KTiedInfo._fields, "state.adam.m", "state.adam.v",
                               "state.adam.t", "state.t", "state.k.0", "state.k.1"]
    notes = {x for name in t.outputs for x in re.findall(r"\(([a-z_]+)\.\d+\)", t.tags[name])}
    assert notes == {"ktied", "bbb", "adam"}  # bbb.md holds the bbb and adam equations it reuses


# ----------------------------------------------------------------------------- the printed trace

def _trace(capsys, *argv):
    assert main(["trace", *argv]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


BLOCK = re.compile(r"^\[(?P<label>[^\]]+)\] (?P<name>\S+) (?P<shape>\([\d, ]*\))$")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]\d+)?")
STEP = re.compile(r"^step (\d+):$")


def _blocks(out: str) -> dict:
    """{name: (label, shape, text of the values)} of every printed block: inputs by their name,
    outputs of step 1 by theirs, of step k >= 2 as 'name@k'."""
    blocks, current, k = {}, None, 0
    for line in out.splitlines():
        m, s = BLOCK.match(line), STEP.match(line)
        if s:
            k, current = int(s.group(1)), None
        elif m:
            current = m["name"] if k <= 1 else f"{m['name']}@{k}"
            assert current not in blocks, f"{current} printed twice"
            blocks[current] = (m["label"], ast.literal_eval(m["shape"]), [])
        elif line.startswith("  ") and current is not None:
            blocks[current][2].append(line)
        else:
            current = None
    return {k: (label, shape, "\n".join(text)) for k, (label, shape, text) in blocks.items()}


def _values(block) -> np.ndarray:
    """A block printed in full, as an array of its shape."""
    _, shape, text = block
    if "".join(text).strip() in ("True", "False"):  # a 0-d bool (a config flag)
        return np.array("".join(text).strip() == "True")
    return np.array([float(v) for v in NUMBER.findall(text)]).reshape(shape)


def _header(t) -> list:
    """The five header lines format_trace must open with, from the trace."""
    K = next(iter(t.outputs.values())).shape[0]
    man = t.manifest
    return [f"refbayes trace {t.method}: {K} step(s), {t.options['dtype']}; equations in "
            f"{man['derivation']}",
            f"command: {man['command']}",
            f"model: {man['model']['repr']}, D = {man['model']['D']}",
            "config: " + ", ".join(f"{k}={v!r}" for k, v in t.config.items())]


PRINT_CASES = [(m, {}) for m in METHODS] + [
    ("vadam", {"steps": 3}), ("slang", {"steps": 2, "dtype": "float32"}),
    ("ngvi-full", {"curvature": "exact"}), ("noisy-kfac", {"curvature": "mc", "damping": "exact"}),
    ("laplace", {"structure": "kron", "subset": "last_layer"})]


@pytest.mark.parametrize("method, opts", PRINT_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(PRINT_CASES)])
def test_format_trace_prints_the_header_every_input_in_full_and_every_output_under_its_tag(
        method, opts):
    t = _built(method, **opts)
    out = format_trace(t, precision=16)
    lines = out.splitlines()
    assert out.endswith("\n") and lines[:4] == _header(t)
    assert lines[4].startswith("draws: step 1 after the start from numpy.random.default_rng(seed)")
    assert "derivations/tracing.md" in lines[4]
    rest = lines[5:]
    if t.manifest["note"]:  # noisy-kfac, kfac: the update order
        assert rest.pop(0) == f"order: {t.manifest['note']}"
    assert rest[:2] == [f"condition: {t.manifest['condition_rule']}", ""]
    # each output's scale, once, before the steps
    at = lines.index("scales (which sum over data each output is):")
    assert lines[at + 1:at + 1 + len(t.outputs)] == [
        f"  {n}: {m['scale']}" for n, m in t.manifest["outputs"].items()]
    assert t.manifest["command"].startswith(f"refbayes trace {method} --seed {t.options['seed']} ")
    blocks = _blocks(out)
    K = next(iter(t.outputs.values())).shape[0]
    assert K == (t.options["steps"] if TRACERS[method].chained and method != "swag" else 1)
    assert [f"step {k}:" for k in range(1, K + 1)] == [l for l in lines if STEP.match(l)]
    # every input, in order, in full whatever its size: 16 digits give back the array
    assert [n for n, b in blocks.items() if b[0] == "input"] == list(t.inputs)
    for name, a in t.inputs.items():
        label, shape, _ = blocks[name]
        assert shape == a.shape, name
        np.testing.assert_array_equal(_values(blocks[name]), a, err_msg=name)
    # every output at every step, in the comparison order, under its tag ('untagged' for none)
    for k in range(K):
        names = [n for n, b in blocks.items() if b[0] != "input" and
                 (("@" not in n) if k == 0 else n.endswith(f"@{k + 1}"))]
        assert [n.split("@")[0] for n in names] == list(t.outputs), k
        for name, a in t.outputs.items():
            label, shape, text = blocks[name if k == 0 else f"{name}@{k + 1}"]
            assert label == (t.tags[name] or "untagged"), name
            assert shape == a.shape[1:], name
            if a[k].size <= SHOW_ALL:  # printed in full: the print is the array
                np.testing.assert_array_equal(_values(blocks[name if k == 0 else
                                                            f"{name}@{k + 1}"]), a[k],
                                              err_msg=f"step {k + 1} {name}")
            else:
                assert text.startswith(f"  first {SHOW_FIRST} of {a[k].size} entries (C order): [")


def test_the_cli_prints_format_trace(capsys):
    for method in ("slang", "laplace", "vogn"):
        assert _trace(capsys, method) == format_trace(_built(method))
    assert _trace(capsys, "swag", "--precision", "16") == format_trace(_built("swag"), 16)
    out = _trace(capsys, "vadam", "--steps", "3", "--dtype", "float32")
    assert out == format_trace(_built("vadam", steps=3, dtype="float32"))
    assert out.startswith("refbayes trace vadam: 3 step(s), float32; equations in ")


def test_printed_labels_and_shapes_of_the_default_problem(capsys):
    out = _trace(capsys, "slang")
    for header in ["[input] input.batch.idx (1, 8)", "[input] input.eps (1, 6, 1)",
                   "[input] input.state.U (6, 2)", "[(ngvi.12)] alpha_t ()",
                   "[(slang.7)] theta (6, 1)", "[(slang.8)] G (1, 8, 6)",
                   "[(slang.2)] W (6, 10)", "[(slang.2)] U (6, 2)", "[(slang.6)] mu (6,)",
                   "[untagged] state.t ()"]:
        assert f"\n{header}\n" in out, header
    out = _trace(capsys, "ngvi-full", "--curvature", "exact")
    assert "[(ngvi.4)] Sigma_inv (6, 6)" in out and "[(ngvi.6)] theta (6, 0)" in out
    assert "input.eps" not in out  # curvature 'exact' draws no eps
    assert "[(ngvi.15)] prec_diag (6,)" in _trace(capsys, "ngvi-meanfield")


def test_momentum_shows_after_the_first_step():
    plain = _built("slang").outputs
    np.testing.assert_array_equal(plain["direction"], plain["g_tilde"])
    moving = _built("slang", momentum=0.9, t=3).outputs
    assert not np.allclose(moving["direction"], moving["g_tilde"])


def test_large_arrays_show_their_first_entries_and_norm(tmp_path, capsys):
    path = tmp_path / "t.json"
    out = _trace(capsys, "ngvi-meanfield", "--M", "50", "--S", "5", "--precision", "16",
                 "--json", str(path))
    G = np.array(json.loads(path.read_text())["outputs"]["G"])[0]
    assert G.shape == (5, 50, 6)
    _, shape, text = _blocks(out)["G"]
    assert shape == (5, 50, 6)
    assert text.startswith("  first 10 of 1500 entries (C order): [")
    shown = [float(v) for v in NUMBER.findall(text.split("norm:")[0].split(": ", 1)[1])]
    np.testing.assert_array_equal(shown, G.reshape(-1)[:10])
    norm = float(text.splitlines()[-1].split("norm:")[1])
    assert_close(norm, np.linalg.norm(G), EXACT_F64, "norm")
    assert "input.batch.X (1, 50, 5)\n  [[[" in out  # inputs are printed in full, any size


def test_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "slang", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    assert A["input.eps"] != C["input.eps"] and A["input.batch.idx"] != C["input.batch.idx"]


# ----------------------------------------------------------------------------- the JSON form

JSON_CASES = PRINT_CASES


@pytest.mark.parametrize("method, opts", JSON_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(JSON_CASES)])
def test_to_json_round_trips_every_array_exactly(method, opts):
    t = _built(method, **opts)
    data = json.loads(json.dumps(to_json(t)))
    assert list(data) == ["manifest", "inputs", "outputs"]
    assert data["manifest"] == t.manifest
    assert list(data["inputs"]) == list(t.inputs) and list(data["outputs"]) == list(t.outputs)
    for group, arrays in (("inputs", t.inputs), ("outputs", t.outputs)):
        for name, a in arrays.items():
            meta = data["manifest"][group][name]
            assert meta["shape"] == list(a.shape) and meta["dtype"] == str(a.dtype), name
            back = np.array(data[group][name])
            if a.size == 0:  # nested lists lose the trailing axes of an empty array (theta
                # (6, 0), G (0, M, D) without draws): the manifest's shape and dtype restore it
                assert back.size == 0, name
                back = back.astype(meta["dtype"]).reshape(meta["shape"])
            assert back.shape == a.shape and back.dtype.kind == a.dtype.kind, name
            np.testing.assert_array_equal(back, a, err_msg=name)


def test_cli_json_writes_to_json_of_the_printed_trace(capsys, tmp_path):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, "laplace", "--S", "3", "--json", str(path))
    assert out.rstrip().endswith(f"json: {path}")
    assert out == format_trace(_built("laplace", S=3)) + f"json: {path}\n"
    assert json.loads(path.read_text()) == json.loads(json.dumps(to_json(_built("laplace", S=3))))


def test_cli_json_works_for_a_driver_method(capsys, tmp_path):
    """`refbayes trace vogn --json F` (a driver method, once refused) writes its trace's JSON."""
    path = tmp_path / "vogn.json"
    out = _trace(capsys, "vogn", "--steps", "2", "--precision", "16", "--json", str(path))
    t = _built("vogn", steps=2)
    assert out == format_trace(t, 16) + f"json: {path}\n"
    data = json.loads(path.read_text())
    assert data["manifest"]["method"] == "vogn" and data["manifest"]["options"]["steps"] == 2
    assert list(data["outputs"]) == list(t.outputs)
    for group, arrays in (("inputs", t.inputs), ("outputs", t.outputs)):
        for name, a in arrays.items():
            np.testing.assert_array_equal(np.array(data[group][name]), a, err_msg=name)
    assert np.array(data["outputs"]["g_hat"]).shape == (2, 34)  # the leading step axis


def test_json_creates_only_its_own_folder(capsys, tmp_path):
    """--json creates the file's folder when that folder's parent exists, and nothing above it:
    a path whose grandparent is missing is an error naming the path, before any output."""
    path = tmp_path / "new" / "t.json"
    _trace(capsys, "slang", "--json", str(path))
    assert json.loads(path.read_text())["manifest"]["method"] == "slang"
    deep = tmp_path / "no" / "such" / "dir" / "t.json"
    assert main(["trace", "slang", "--json", str(deep)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"refbayes: error: --json: cannot write {deep}: ")
    assert str(tmp_path / "no" / "such") in captured.err and "does not exist" in captured.err
    assert not (tmp_path / "no").exists()
    (tmp_path / "afile").write_text("x")
    assert main(["trace", "slang", "--json", str(tmp_path / "afile" / "t.json")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_shims_still_expose_the_old_names():
    """refbayes.trace and refbayes.golden re-export refbayes.tracing for one release."""
    old_trace = importlib.import_module("refbayes.trace")
    old_golden = importlib.import_module("refbayes.golden")
    for name in ("build", "load", "make_inputs", "find_map"):
        assert getattr(old_trace, name) is {"make_inputs": make_inputs, "find_map": find_map,
                                            "build": build,
                                            "load": refbayes.tracing.load}[name], name
    for name in ("build", "load", "find_map", "save", "TRACERS", "field_tags", "derivation_of",
                 "model_from_spec", "main"):
        assert hasattr(old_golden, name), name
    assert old_golden.build is build and old_golden.load is refbayes.tracing.load
    assert old_golden.find_map is find_map
    inputs = old_trace.make_inputs("slang", seed=4)
    np.testing.assert_array_equal(old_trace.step(inputs)[1].U, step(inputs)[1].U)


# ----------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv, message", [
    (["nosuch"], "method: expected one of slang, ngvi-full, ngvi-meanfield, laplace, "
                 "riemannian-laplace, swag, noisy-kfac, kfac, ktied, slang-mlp, vogn, ogn, "
                 "vadam, vprop, noisy-adam, bbb, mc-dropout, adam, got 'nosuch'"),
    (["slang", "--M", "0"], "M: expected an integer in [1, 50], got 0"),
    (["slang", "--L", "7"], "L: expected an integer in [1, 6], got 7"),
    (["slang", "--curvature", "hess"], "curvature: SLANG uses the empirical Fisher only"),
    (["ngvi-full", "--curvature", "fisher"], "curvature: expected one of"),
    (["ngvi-full", "--momentum", "1.0"], "cfg.momentum: expected a value in [0.0, 1.0), got 1.0"),
    (["slang", "--precision", "30"], "precision: expected an integer in [0, 17], got 30"),
    (["laplace", "--curvature", "hess"],
     "curvature: expected one of ggn, hessian, ef for laplace, got 'hess'"),
    (["laplace", "--subset", "first_layer"],
     "subset: expected one of all, last_layer for laplace, got 'first_layer'"),
    (["riemannian-laplace", "--structure", "lowrank"],
     "structure: expected one of full, diag, kron for riemannian-laplace, got 'lowrank'"),
    (["laplace", "--structure", "kron", "--curvature", "hessian"],
     "cfg.curvature: structure 'kron' factors the GGN or the EF (curvature 'ggn' or 'ef'), "
     "got 'hessian'"),
    (["laplace", "--prior-precision", "0"],
     "prior_precision: expected a value in (0.0, inf), got 0.0"),
    (["laplace", "--prior-precision", "inf"], "prior_precision: expected a finite real number"),
    (["laplace", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["laplace", "--seed", "-1"], "seed: expected an integer in [0, inf), got -1"),
    (["riemannian-laplace", "--ode-method", "Euler"],
     "ode_method: expected one of RK45, RK23, DOP853 for riemannian-laplace, got 'Euler'"),
    (["riemannian-laplace", "--rtol", "1e-20"], "rtol: expected a value in [2.22"),
    (["riemannian-laplace", "--atol", "-1"], "atol: expected a value in [0.0, inf), got -1.0"),
    (["laplace", "--rtol", "1e-3"], "--rtol: applies to riemannian-laplace only, not laplace"),
    (["laplace", "--M", "4"],
     "--M: applies to slang, ngvi-full, ngvi-meanfield, swag, noisy-kfac, kfac, ktied, "
     "slang-mlp, vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam only, "
     "not laplace"),
    (["riemannian-laplace", "--momentum", "0.5"],
     "--momentum: applies to slang, ngvi-full, ngvi-meanfield, swag only, not riemannian-laplace"),
    (["slang", "--prior-precision", "2"],
     "--prior-precision: applies to laplace, riemannian-laplace only, not slang"),
    (["ngvi-full", "--ode-method", "RK23"],
     "--ode-method: applies to riemannian-laplace only, not ngvi-full"),
    (["swag", "--steps", "1"], "steps: expected an integer in [2, inf) (the low-rank covariance "
                               "divides by K' - 1, K' = min(steps, K)), got 1"),
    (["swag", "--K", "1"], "K: expected an integer in [2, inf) (the low-rank covariance"),
    (["swag", "--scale", "0"], "scale: expected a value in (0.0, inf), got 0.0"),
    (["swag", "--alpha", "-0.001"], "alpha: expected a value in (0.0, inf), got -0.001"),
    (["swag", "--alpha", "nan"], "alpha: expected a finite real number in (0.0, inf), got nan"),
    (["swag", "--momentum", "1"], "momentum: expected a value in [0.0, 1.0), got 1.0"),
    (["swag", "--M", "51"], "M: expected an integer in [1, 50], got 51"),
    (["swag", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["swag", "--seed", "-2"], "seed: expected an integer in [0, inf), got -2"),
    (["swag", "--curvature", "ef"], "--curvature: applies to slang, ngvi-full, ngvi-meanfield, "
                                    "laplace, riemannian-laplace, noisy-kfac, kfac, vogn, ogn only, "
                                    "not swag"),
    (["swag", "--L", "2"], "--L: applies to slang, ngvi-full, ngvi-meanfield, slang-mlp only, not swag"),
    (["swag", "--prior-precision", "2"],
     "--prior-precision: applies to laplace, riemannian-laplace only, not swag"),
    (["laplace", "--steps", "3"], "--steps: laplace is traced as one fit; expected 1, got 3"),
    (["laplace", "--K", "3"], "--K: applies to swag only, not laplace"),
    (["ngvi-full", "--scale", "1"], "--scale: applies to swag only, not ngvi-full"),
    (["riemannian-laplace", "--alpha", "0.1"],
     "--alpha: applies to swag only, not riemannian-laplace"),
    (["noisy-kfac", "--damping", "dense"],
     "damping: expected one of factored, exact for noisy-kfac, got 'dense'"),
    (["kfac", "--curvature", "hessian"],
     "curvature: expected one of ggn, ef, mc for kfac, got 'hessian'"),
    (["noisy-kfac", "--curvature", "exact"],
     "curvature: expected one of ggn, ef, mc for noisy-kfac, got 'exact'"),
    (["noisy-kfac", "--kl-clip", "0"], "kl_clip: expected a value in (0.0, inf), got 0.0"),
    (["kfac", "--kl-clip", "inf"], "kl_clip: expected a finite real number"),
    (["noisy-kfac", "--M", "0"], "M: expected an integer in [1, 50], got 0"),
    (["noisy-kfac", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["noisy-kfac", "--seed", "-1"], "seed: expected an integer in [0, inf), got -1"),
    (["kfac", "--S", "2"], "--S: applies to slang, ngvi-full, ngvi-meanfield, laplace, "
                           "riemannian-laplace, swag, noisy-kfac, ktied, slang-mlp, vogn, vadam, vprop, "
                           "noisy-adam, bbb only, not kfac"),
    (["noisy-kfac", "--L", "2"], "--L: applies to slang, ngvi-full, ngvi-meanfield, slang-mlp only, "
                                 "not noisy-kfac"),
    (["kfac", "--momentum", "0.5"], "--momentum: applies to slang, ngvi-full, ngvi-meanfield, "
                                    "swag only, not kfac"),
    (["noisy-kfac", "--alpha", "0.1"], "--alpha: applies to swag only, not noisy-kfac"),
    (["slang", "--damping", "exact"], "--damping: applies to noisy-kfac, kfac only, not slang"),
    (["swag", "--kl-clip", "1e-3"], "--kl-clip: applies to noisy-kfac, kfac only, not swag"),
    (["ktied", "--k", "0"], "k: expected an integer in [1, inf), got 0"),
    (["ktied", "--M", "31"], "M: expected an integer in [1, 30], got 31"),
    (["ktied", "--M", "0"], "M: expected an integer in [1, 30], got 0"),
    (["ktied", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["ktied", "--seed", "-1"], "seed: expected an integer in [0, inf), got -1"),
    (["ktied", "--curvature", "ef"], "--curvature: applies to slang, ngvi-full, ngvi-meanfield, "
                                     "laplace, riemannian-laplace, noisy-kfac, kfac, vogn, ogn only, "
                                     "not ktied"),
    (["ktied", "--L", "2"], "--L: applies to slang, ngvi-full, ngvi-meanfield, slang-mlp only, not ktied"),
    (["ktied", "--K", "2"], "--K: applies to swag only, not ktied"),
    (["ktied", "--alpha", "0.1"], "--alpha: applies to swag only, not ktied"),
    (["ktied", "--damping", "exact"], "--damping: applies to noisy-kfac, kfac only, not ktied"),
    (["slang", "--k", "2"], "--k: applies to ktied only, not slang"),
    (["swag", "--k", "2"], "--k: applies to ktied only, not swag"),
    # the driven methods (issue 35, items 1 and 2): M in [1, N], S >= 1, checked before building
    (["vogn", "--M", "0"], "M: expected an integer in [1, 50] (the rows of the shipped problem), "
                           "got 0"),
    (["vogn", "--M", "1000"], "M: expected an integer in [1, 50] (the rows of the shipped "
                              "problem), got 1000"),
    (["vogn", "--M", "-1"], "M: expected an integer in [1, 50]"),
    (["ogn", "--M", "0"], "M: expected an integer in [1, 50]"),
    (["mc-dropout", "--M", "0"], "M: expected an integer in [1, 50]"),
    (["adam", "--M", "51"], "M: expected an integer in [1, 50]"),
    (["bbb", "--M", "51"], "M: expected an integer in [1, 50]"),
    (["slang-mlp", "--M", "0"], "M: expected an integer in [1, 50]"),
    (["vogn", "--S", "0"], "S: expected an integer in [1, inf) for vogn, got 0 (S = 0 is traced "
                           "as `refbayes trace ogn`)"),
    (["vogn", "--S", "-1"], "S: expected an integer in [1, inf) for vogn, got -1"),
    (["vadam", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["slang-mlp", "--S", "0"], "S: expected an integer in [1, inf), got 0"),
    (["noisy-adam", "--S", "-2"], "S: expected an integer in [1, inf), got -2"),
    (["slang-mlp", "--L", "-1"], "L: expected an integer in [1, 34], got -1"),
    (["slang-mlp", "--L", "35"], "L: expected an integer in [1, 34], got 35"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    assert main(["trace", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"refbayes: error: {message}") and out.err.count("\n") == 1


@pytest.mark.parametrize("method, options", [
    ("vogn", {"M": 1000}), ("vogn", {"M": 0}), ("vogn", {"S": 0}), ("ogn", {"M": 51}),
    ("adam", {"M": -1}), ("vadam", {"S": 0}),
])
def test_build_refuses_driven_options_out_of_range(method, options):
    """No clamp (M 1000 ran with 50 and recorded 1000) and no reinterpretation (vogn S 0 ran
    OGN): the Python API refuses them as the command line does."""
    with pytest.raises(ValueError, match=f"^{next(iter(options))}: expected an integer in "):
        build(method, **options)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("flag, path", [("--save", "/proc/nope/v.npz"),
                                        ("--save", "/proc/v.npz"),
                                        ("--json", "/proc/nope/v.json"),
                                        ("--json", "/proc/v.json")])
def test_an_unwritable_output_path_is_an_error_naming_the_flag_and_the_path(capsys, flag, path):
    """An OSError of writing names --save / --json and the path asked for, never the temporary
    file beside it (issue 35, item 1)."""
    assert main(["trace", "adam", flag, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: {flag}: cannot write {path}: "), err
    assert err.count("\n") == 1 and ".tmp" not in err


def _options_shown(out: str) -> set:
    return set(re.findall(r"^  (?:-\w, )?(--[\w-]+)", out, flags=re.MULTILINE))


def test_method_help_shows_only_that_methods_options_with_its_defaults(capsys):
    """`refbayes trace METHOD --help` (issue 35, item 4): the method's own options from
    TRACERS[method].options, with its defaults; `refbayes trace --help` keeps every option."""
    from refbayes.tracing.cli import options_table
    common = {"--seed", "--precision", "--json", "--save", "--steps", "--dtype", "--help"}
    for method, tracer in TRACERS.items():
        assert main(["trace", method, "--help"]) == 0
        out = capsys.readouterr().out
        flags = {"--" + (d if len(d) == 1 else d.replace("_", "-")) for d in tracer.options}
        assert _options_shown(out) == common | flags, method
        assert out.startswith(f"usage: refbayes trace {method} ")
    assert main(["trace", "noisy-kfac", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--S", 2), ("--curvature", "ggn"), ("--M", 8),
                          ("--damping", "factored"), ("--kl-clip", None)]:
        assert re.search(re.escape(flag) + r" \S+ .*?\(default: " + re.escape(str(default)) + r"\)",
                         out), flag
    assert "default by method" not in out and "vogn" not in out
    assert main(["trace", "--help"]) == 0                      # no method: the full list
    out = capsys.readouterr().out
    assert _options_shown(out) >= {"--" + (d if len(d) == 1 else d.replace("_", "-"))
                                   for d in options_table()}
    assert "default by method" in out
    assert main(["trace", "nosuch", "--help"]) == 0            # unknown method: the full list
    assert "default by method" in capsys.readouterr().out


def test_help_lists_trace(capsys):
    assert main(["--help"]) == 0
    assert "trace" in capsys.readouterr().out
    assert main(["trace", "--help"]) == 0
    out = capsys.readouterr().out
    assert "METHOD" in out and "--json" in out and "--precision" in out
    for option in ("--prior-precision", "--structure", "--ode-method", "--rtol", "--atol",
                   "--steps", "--K", "--scale", "--alpha", "--damping", "--kl-clip", "--k "):
        assert option in out, option
    assert "laplace" in out and "riemannian-laplace" in out and "swag" in out
    assert "noisy-kfac" in out and "kfac" in out and "ktied" in out


# ----------------------------------------------------------------------------- the step methods

CASES = [
    ("slang", {}),
    ("slang", {"seed": 7, "M": 4, "S": 2, "L": 3, "momentum": 0.9, "t": 3}),
    ("slang", {"L": 6}),
    ("ngvi-full", {}),
    ("ngvi-full", {"curvature": "hess", "S": 2, "seed": 1}),
    ("ngvi-full", {"curvature": "exact", "momentum": 0.5, "t": 2}),
    ("ngvi-meanfield", {}),
    ("ngvi-meanfield", {"curvature": "hess", "M": 50, "S": 3}),
    ("ngvi-meanfield", {"curvature": "exact"}),
]


def _direct_step(method, opts, t):
    """The step called directly, on the shipped problem's rows and the trace's draws and state."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    idx = t.inputs["input.batch.idx"][0]
    batch = Batch(X[idx], y[idx])
    np.testing.assert_array_equal(t.inputs["input.batch.X"][0], batch.X)
    np.testing.assert_array_equal(t.inputs["input.batch.y"][0], batch.y)
    eps = t.inputs["input.eps"][0] if "input.eps" in t.inputs else None
    fields = [f for f in STATE[method]._fields if f != "t"]
    assert int(t.inputs["input.state.t"]) == opts.get("t", 0)
    state = STATE[method](*[t.inputs[f"input.state.{f}"] for f in fields], opts.get("t", 0))
    lam = np.ones(6)
    np.testing.assert_array_equal(t.inputs["input.cfg.lam"], lam)
    if method == "slang":
        cfg = slang.SLANGConfig(N=50, lam=lam, L=opts.get("L", 2),
                                momentum=opts.get("momentum", 0.0))
        return slang.step(state, batch, eps, cfg, LogisticRegression(5))
    cfg = ngvi.NGVIConfig(N=50, lam=lam, curvature=opts.get("curvature", "ef"),
                          momentum=opts.get("momentum", 0.0))
    fn = ngvi.step_full if method == "ngvi-full" else ngvi.step_meanfield
    return fn(state, batch, eps, cfg, LogisticRegression(5))


@pytest.mark.parametrize("method, opts", CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_step_outputs_equal_a_direct_step_on_the_trace_inputs(method, opts):
    t = _built(method, **opts)
    assert t.options == {**t.options, **opts}
    if opts.get("curvature") == "exact":
        assert "input.eps" not in t.inputs
    else:
        assert t.inputs["input.eps"].shape == (1, 6, opts.get("S", 1))
    new, info = _direct_step(method, opts, t)
    extra = [f"state.{f}" for f in new._fields if f not in info._fields]
    assert list(t.outputs) == [f for f in info._fields if getattr(info, f) is not None] + extra
    for field, value in info._asdict().items():
        if value is None:
            assert field not in t.outputs
            continue
        saved = t.outputs[field][0]
        assert saved.shape == np.shape(value), field
        assert_close(saved, np.asarray(value), EXACT_F64, f"{method} {field}")
    for name in extra:
        assert_close(t.outputs[name][0], np.asarray(getattr(new, name[6:])), EXACT_F64, name)


def test_the_first_chained_step_is_make_inputs_step():
    """The trace's step 1 is ``step(make_inputs(...))``: the same draws, state and outputs."""
    for method, opts in CASES[:2] + CASES[5:6]:
        inputs = make_inputs(method, **opts)
        _, info = step(inputs)
        t = _built(method, **opts)
        np.testing.assert_array_equal(t.inputs["input.batch.idx"][0], inputs.idx)
        if inputs.eps is not None:
            np.testing.assert_array_equal(t.inputs["input.eps"][0], inputs.eps)
        for f in inputs.state._fields:
            np.testing.assert_array_equal(t.inputs[f"input.state.{f}"], getattr(inputs.state, f))
        for field, value in info._asdict().items():
            if value is not None:
                np.testing.assert_array_equal(t.outputs[field][0], value, err_msg=field)


# ----------------------------------------------------------------------------- the Laplace traces

def _shipped_problem():
    """The documented recipe, re-drawn here (not by calling refbayes.tracing)."""
    prng = np.random.default_rng(0)
    X = prng.uniform(-3.0, 3.0, (30, 1))
    y = np.sin(X[:, 0]) + prng.standard_normal(30) / 4.0
    model = MLP([1, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=16.0)
    return model, X, y


LA_CASES = [
    ("laplace", {}),
    ("laplace", {"structure": "diag", "curvature": "hessian", "seed": 3, "S": 3}),
    ("laplace", {"curvature": "ef", "prior_precision": 2.5}),
    ("laplace", {"structure": "kron", "curvature": "ef", "prior_precision": 2.5}),
    # laplace-torch's default (last layer, K-FAC), and the last layer's exact Hessian
    ("laplace", {"subset": "last_layer", "structure": "kron", "S": 3}),
    ("laplace", {"subset": "last_layer", "curvature": "hessian", "prior_precision": 2.5}),
    ("riemannian-laplace", {}),
    ("riemannian-laplace", {"subset": "last_layer", "structure": "diag"}),
    # ODE_F64's setting (DOP853, rtol = atol = 1e-12); a stronger prior keeps v, and nfev, small
    ("riemannian-laplace", {"structure": "diag", "curvature": "hessian", "ode_method": "DOP853",
                            "rtol": 1e-12, "atol": 1e-12, "S": 1, "seed": 5,
                            "prior_precision": 2.5}),
]


def _direct_laplace(method, t):
    """Every intermediate, from the trace's inputs, by direct calls of the library (and of the
    model for H and the evidence terms, by their definitions)."""
    model, X, y = _shipped_problem()
    theta_map = t.inputs["input.map.theta_map"]
    eps = t.inputs["input.eps"]
    X_star = t.inputs["input.X_star"]
    c = t.config
    delta = np.full(13, c["prior_precision"])
    cfg = laplace.LaplaceConfig(prior_precision=c["prior_precision"], structure=c["structure"],
                                curvature=c["curvature"], subset=c["subset"])
    off = 0 if c["subset"] == "all" else 8  # MLP([1, 4, 1])'s last layer: W_2 (4, 1), b_2
    state = laplace.fit(model, theta_map, X, y, cfg)
    precision = {"full": state.Sigma_inv, "diag": state.prec_diag,
                 "kron": laplace.dense_precision(state)}[c["structure"]]
    theta_s = laplace.sample(state, eps)
    if method == "laplace":
        H = {"ggn": lambda: model.ggn(theta_map, X, y),
             "hessian": lambda: model.hessian(theta_map, X, y),
             "ef": lambda: (lambda G: G.T @ G)(model.per_example_grads(theta_map, X, y))}
        H = H[c["curvature"]]()[off:, off:]  # the random block (laplace.23)
        delta, mu = delta[off:], theta_map[off:]
        if c["structure"] == "kron":  # (laplace.18): blockdiag(A_l kron B_l) from the model
            head, phi = model.last_layer(theta_map, X) if off else (model, X)
            H = scipy.linalg.block_diag(*[np.kron(A, B) for A, B in head.kfac_curvature(
                theta_map[off:], phi, y, c["curvature"])])
            assert_close(precision, H + np.diag(delta), EXACT_F64, "P = K-FAC + diag(delta)")
        elif c["structure"] == "diag":
            H = np.diagonal(H).copy()
            assert_close(precision, H + delta, EXACT_F64, "prec_diag = diag(H) + delta")
        else:
            assert_close(precision, H + np.diag(delta), EXACT_F64, "Sigma_inv = H + diag(delta)")
        log_det = np.linalg.slogdet(np.diag(precision) if precision.ndim == 1 else precision)[1]
        pred = laplace.glm_predictive(model, state, X_star)
        scatter = mu @ (delta * mu)
        return {"H": H, "precision": precision, "theta_s": theta_s,
                "log_lik": -model.loss(theta_map, X, y),
                "log_prior": (np.sum(np.log(delta)) - (13 - off) * np.log(2 * np.pi) - scatter) / 2,
                "log_det": log_det,
                "log_Z": laplace.log_marginal_likelihood(model, state, X, y, cfg),
                "log_det_ratio": log_det - np.sum(np.log(delta)), "scatter": scatter,
                "f_mean": pred.f_mean, "f_var": pred.f_var, "y_var": pred.y_var}
    ode = riemannian_laplace.RiemannianLaplaceConfig(t.options["ode_method"],
                                                     float(t.inputs["input.cfg.ode.rtol"]),
                                                     float(t.inputs["input.cfg.ode.atol"]))

    def grad_fn(theta):
        return model.grad(theta, X, y) + delta * theta

    def hvp_fn(theta, u):
        return model.hvp(theta, u, X, y) + delta * u

    V = theta_map[:, None] - theta_s
    ends = [riemannian_laplace.exp_map(theta_map, V[:, s].copy(), grad_fn, hvp_fn, ode)[1]
            for s in range(V.shape[1])]
    return {"precision": precision, "theta_s": theta_s, "V": V, "g": grad_fn(theta_map),
            "c": np.stack([e.c for e in ends], axis=1),
            "cdot": np.stack([e.cdot for e in ends], axis=1),
            "nfev": np.array([e.nfev for e in ends]),
            "n_steps": np.array([e.n_steps for e in ends]),
            "speed_0": np.array([v @ v + (grad_fn(theta_map) @ v) ** 2 for v in V.T]),
            "speed_1": np.array([riemannian_laplace.squared_speed(grad_fn, e.c, e.cdot)
                                 for e in ends])}


@pytest.mark.parametrize("method, opts", LA_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(LA_CASES)])
def test_laplace_outputs_equal_direct_library_calls_on_the_trace_inputs(method, opts):
    t = _built(method, **opts)
    assert t.method == method and t.options["seed"] == opts.get("seed", 0)
    # the recorded problem is the documented recipe
    model, X, y = _shipped_problem()
    np.testing.assert_array_equal(t.inputs["input.batch.X"], X)  # the fit consumes every row
    np.testing.assert_array_equal(t.inputs["input.batch.y"], y)
    np.testing.assert_array_equal(t.inputs["input.X_star"], np.linspace(-3, 3, 5)[:, None])
    assert t.model["repr"] == repr(model) and t.model["D"] == 13
    D_q = 5 if opts.get("subset") == "last_layer" else 13
    eps = np.random.default_rng(opts.get("seed", 0)).standard_normal((D_q, opts.get("S", 2)))
    np.testing.assert_array_equal(t.inputs["input.eps"], eps)  # the documented draw
    ode = {} if method == "laplace" else {
        "ode.method": opts.get("ode_method", "RK45"), "ode.rtol": opts.get("rtol", 1e-6),
        "ode.atol": opts.get("atol", 1e-3)}
    assert t.config == {"prior_precision": opts.get("prior_precision", 1.0),
                        "structure": opts.get("structure", "full"),
                        "curvature": opts.get("curvature", "ggn"),
                        "subset": opts.get("subset", "all"), **ode}
    assert float(t.inputs["input.cfg.prior_precision"]) == t.config["prior_precision"]
    if method == "riemannian-laplace":
        assert (t.options["ode_method"], t.options["rtol"], t.options["atol"]) == \
            (opts.get("ode_method", "RK45"), opts.get("rtol", 1e-6), opts.get("atol", 1e-3))
        assert float(t.inputs["input.cfg.ode.rtol"]) == t.options["rtol"]
        assert float(t.inputs["input.cfg.ode.atol"]) == t.options["atol"]
    # the MAP the trace records is the recipe's, for this prior (never the seed)
    found = shipped_map(opts.get("prior_precision", 1.0))
    np.testing.assert_array_equal(t.inputs["input.map.theta_map"], found.theta_map)
    np.testing.assert_array_equal(t.inputs["input.map.theta0"],
                                  model.init_theta(np.random.default_rng(0), dtype=np.float64))
    direct = _direct_laplace(method, t)
    assert list(t.outputs) == list(INFO[method]._fields) == list(direct)
    for field, value in direct.items():
        saved = t.outputs[field][0]
        assert saved.shape == np.shape(value), field
        assert_close(saved, np.asarray(value, dtype=float), EXACT_F64, f"{method} {field}")
    v = {k: float(a[0]) for k, a in t.outputs.items() if a[0].ndim == 0}
    if method == "laplace":  # the evidence two ways: (laplace.5) and laplace-torch's (laplace.6)
        assert_close(v["log_lik"] + v["log_prior"] + D_q / 2 * np.log(2 * np.pi) - v["log_det"] / 2,
                     v["log_Z"], EXACT_F64, "(laplace.5)")
        assert_close(v["log_lik"] - (v["log_det_ratio"] + v["scatter"]) / 2, v["log_Z"],
                     EXACT_F64, "(laplace.6)")
    else:
        assert np.linalg.norm(t.outputs["g"][0]) < MAP_GTOL  # g = grad L(theta_map) ~ 0
        assert t.manifest["absolute"] == {"g": MAP_GTOL}
        if t.options["rtol"] == 1e-12:  # ODE_F64's solve conserves (riemannian_laplace.11)
            assert_close(t.outputs["speed_1"][0], t.outputs["speed_0"][0], ODE_F64, "speed")


def test_the_traced_map_is_stationary(capsys):
    """The MAP recipe reaches MAP_GTOL, and so does the gradient recomputed from the printed
    theta_map (riemannian-laplace's g is checked above)."""
    model, X, y = _shipped_problem()
    found = find_map(model, X, y, np.ones(13))
    assert found.grad_norm < MAP_GTOL and found.newton_steps >= 0 and found.lbfgs_nit > 0
    out = _trace(capsys, "laplace", "--precision", "16")
    theta = _values(_blocks(out)["input.map.theta_map"])
    np.testing.assert_array_equal(theta, found.theta_map)
    grad = model.grad(theta, X, y) + theta  # prior precision 1
    assert np.linalg.norm(grad) < MAP_GTOL
    # a minimum, not a saddle: the Hessian of the negative log joint is positive definite
    assert np.linalg.eigvalsh(model.hessian(theta, X, y) + np.eye(13)).min() > 0
    m2, X2, y2, X_star = regression_problem()  # the shipped problem is the recipe
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    assert repr(m2) == repr(model) and X_star.shape == (5, 1)


def test_laplace_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "laplace", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    assert A["input.eps"] != C["input.eps"] and A["theta_s"] != C["theta_s"]
    for same in ("input.map.theta_map", "H", "precision", "log_Z", "f_var"):  # seed-free MAP
        assert A[same] == C[same], same
    other = _blocks(_trace(capsys, "laplace", "--seed", "3", "--prior-precision", "2"))
    assert other["input.map.theta_map"] != A["input.map.theta_map"]  # refound for the prior


def test_official_tolerances_drift_from_the_conserved_speed():
    """The solver options reach the solve: at the official defaults (atol = 1e-3) the conserved
    speed (riemannian_laplace.11) drifts far beyond ODE_F64, which a tight solve meets (above)."""
    out = _built("riemannian-laplace", S=1, structure="diag", curvature="hessian", seed=5,
                 prior_precision=2.5).outputs
    assert abs(out["speed_1"][0, 0] / out["speed_0"][0, 0] - 1) > 1e3 * ODE_F64


# ----------------------------------------------------------------------------- the SWAG trace

def _swag_draws(seed=0, steps=6, M=8, S=2, K=4):
    """The module docstring's draws, re-drawn here in its order (not by calling trace)."""
    rng = np.random.default_rng(seed)
    theta0 = 0.5 * rng.standard_normal(6)
    idx = np.array([rng.permutation(50)[:M] for _ in range(steps)])
    z1 = rng.standard_normal((6, S))
    z2 = rng.standard_normal((min(steps, K), S))
    return {"theta0": theta0, "idx": idx, "z1": z1, "z2": z2}


def _swag_settings(opts):
    """The options with the documented defaults filled in."""
    return {"seed": 0, "steps": 6, "M": 8, "S": 2, "K": 4, "scale": 0.5, "alpha": 2e-3,
            "momentum": 0.9, **opts}


def _swag_library(t):
    """Every intermediate by direct calls of refbayes.methods.swag on the trace's inputs."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    model = LogisticRegression(5)
    i = t.inputs
    sgd_cfg = swag.SGDConfig(N=int(i["input.cfg.sgd.N"]), lam=float(i["input.cfg.sgd.lam"]),
                             alpha=float(i["input.cfg.sgd.alpha"]),
                             momentum=float(i["input.cfg.sgd.momentum"]))
    cfg = swag.SWAGConfig(**{k: v for k, v in t.config.items() if not k.startswith("sgd.")})
    diag = cfg._replace(scale=1.0)  # SWAG-Diagonal at the paper's scale 1
    theta0, z1, z2 = i["input.state.theta"], i["input.eps.z1"], i["input.eps.z2"]
    opt, state = swag.sgd_init(theta0.copy()), swag.init(theta0, cfg)
    rows = []
    for idx in i["input.batch.idx"]:
        opt, s_info = swag.sgd_step(opt, Batch(X[idx], y[idx]), None, sgd_cfg, model)
        state, c_info = swag.collect(state, opt.theta, cfg)
        rows.append([np.array(a) for a in (*s_info, *c_info)])
    out = dict(zip(("g", "v", "theta", "theta_bar", "theta2_bar", "dev"),
                   (np.stack(col) for col in zip(*rows))))
    theta_s, theta_s_diag = swag.sample(state, z1, z2, cfg), swag.sample(state, z1, None, diag)
    return {**out, "Sigma_diag": swag.diag_variance(state, cfg), "D_hat": swag.deviations(state),
            "Sigma": swag.dense_covariance(state, cfg), "theta_s": theta_s,
            "log_q": swag.log_density(state, theta_s, cfg), "theta_s_diag": theta_s_diag,
            "log_q_diag": swag.log_density(state, theta_s_diag, diag, low_rank=False)}


def _swag_by_hand(draws, o):
    """The same intermediates from the equations of derivations/swag.md, written out in NumPy
    (closed-form logistic gradient, batch moments, a dense Gaussian): no refbayes call."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    X1 = np.hstack([X, np.ones((50, 1))])  # intercept last
    theta, v = draws["theta0"].copy(), np.zeros(6)
    g, V, thetas = [], [], []
    for idx in draws["idx"]:
        Xb, yb = X1[idx], y[idx]
        g.append(50 / len(idx) * Xb.T @ (1 / (1 + np.exp(-Xb @ theta)) - yb) + theta)  # (swag.10)
        v = o["momentum"] * v + g[-1]                                                  # (swag.11)
        theta = theta - o["alpha"] * v                                                 # (swag.11)
        V.append(v)
        thetas.append(theta)
    thetas = np.array(thetas)
    n = np.arange(1, len(thetas) + 1)[:, None]
    theta_bar = np.cumsum(thetas, axis=0) / n                      # (swag.1), batch form
    theta2_bar = np.cumsum(thetas ** 2, axis=0) / n                # (swag.2)
    dev = thetas - theta_bar                                       # (swag.3)
    Kp = min(len(thetas), o["K"])
    D_hat = dev[-Kp:].T                                            # the newest K', oldest first
    mean, var = theta_bar[-1], np.maximum(theta2_bar[-1] - theta_bar[-1] ** 2, 1e-30)  # (swag.4)
    Sigma = o["scale"] * (np.diag(var) + D_hat @ D_hat.T / (Kp - 1))                   # (swag.6)
    theta_s = mean[:, None] + np.sqrt(o["scale"]) * (np.sqrt(var)[:, None] * draws["z1"]
                                                     + D_hat @ draws["z2"] / np.sqrt(Kp - 1))
    theta_s_diag = mean[:, None] + np.sqrt(var)[:, None] * draws["z1"]  # scale 1
    diag = multivariate_normal(mean, np.diag(var))
    return {"g": np.array(g), "v": np.array(V), "theta": thetas, "theta_bar": theta_bar,
            "theta2_bar": theta2_bar, "dev": dev, "Sigma_diag": var, "D_hat": D_hat,
            "Sigma": Sigma, "theta_s": theta_s,
            "log_q": multivariate_normal(mean, Sigma).logpdf(theta_s.T).reshape(-1),
            "theta_s_diag": theta_s_diag,
            "log_q_diag": diag.logpdf(theta_s_diag.T).reshape(-1)}


SWAG_CASES = [
    {},  # T = 6 > K = 4: the ring buffer has wrapped, K' = K
    {"seed": 3, "steps": 3, "K": 5, "M": 50, "S": 1},  # K' = 3 < K (buffer not full), full batch
    {"steps": 2, "K": 2, "momentum": 0.0, "alpha": 1e-3, "scale": 1.0, "S": 3},  # the least
    {"seed": 1, "steps": 9, "K": 3, "M": 1, "scale": 0.25, "alpha": 4e-3},  # wraps three times
]


@pytest.mark.parametrize("opts", SWAG_CASES, ids=[f"swag-{i}" for i in range(len(SWAG_CASES))])
def test_swag_outputs_equal_direct_library_calls_and_the_equations(opts):
    t = _built("swag", **opts)
    o = _swag_settings(opts)
    assert t.method == "swag" and t.options == {"dtype": "float64", **o}
    X, y, _ = make_logistic_regression(50, 5, 0)
    sgd = {"N": 50, "lam": 1.0, "alpha": o["alpha"], "momentum": o["momentum"]}
    assert t.config == {**{f"sgd.{k}": v for k, v in sgd.items()}, "K": o["K"],
                        "scale": o["scale"], "var_clamp": 1e-30}
    assert {k: t.inputs[f"input.cfg.sgd.{k}"].item() for k in sgd} == sgd
    assert {k: t.inputs[f"input.cfg.{k}"].item() for k in ("K", "scale", "var_clamp")} == \
        {"K": o["K"], "scale": o["scale"], "var_clamp": 1e-30}
    # the draws are the documented ones, in the documented order, under the naming rule
    draws = _swag_draws(o["seed"], o["steps"], o["M"], o["S"], o["K"])
    names = {"theta0": "input.state.theta", "idx": "input.batch.idx", "z1": "input.eps.z1",
             "z2": "input.eps.z2"}
    for name, value in draws.items():
        np.testing.assert_array_equal(t.inputs[names[name]], value, err_msg=name)
    # each SGD step's minibatch rows: row t of input.batch.X is X[idx[t]]
    np.testing.assert_array_equal(t.inputs["input.batch.X"], X[draws["idx"]])
    np.testing.assert_array_equal(t.inputs["input.batch.y"], y[draws["idx"]])
    library, by_hand = _swag_library(t), _swag_by_hand(draws, o)
    assert list(t.outputs) == list(library) == list(by_hand)
    for field, value in library.items():
        saved = t.outputs[field][0]
        assert saved.shape == np.shape(value), field
        np.testing.assert_array_equal(saved, value, err_msg=field)  # the same calls, bit for bit
        assert_close(saved, by_hand[field], EXACT_F64, f"swag {field} vs the equations")


def test_swag_trace_wraps_its_ring_buffer():
    """With T = 6 > K = 4 the ring has wrapped: D_hat holds the deviations of snapshots 3..6, the
    first (zero) is gone."""
    out = _built("swag").outputs
    assert out["D_hat"].shape == (1, 6, 4)
    assert np.all(out["dev"][0, 0] == 0) and np.all(out["D_hat"][0] != 0)
    np.testing.assert_array_equal(out["D_hat"][0], out["dev"][0, 2:].T)


def test_swag_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "swag", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("input.state.theta", "input.batch.idx", "input.eps.z1", "input.eps.z2",
                 "theta_s"):
        assert A[name] != C[name], name


def test_builders_refuse_the_other_families_methods():
    with pytest.raises(ValueError, match="method: expected one of slang, ngvi-full, "
                                         "ngvi-meanfield, got 'swag'"):
        make_inputs("swag")
    with pytest.raises(ValueError, match="method: expected one of laplace, riemannian-laplace, "
                                         "got 'swag'"):
        make_laplace_inputs("swag")
    with pytest.raises(ValueError, match="got 'laplace'"):
        make_inputs("laplace")
    with pytest.raises(ValueError, match="got 'noisy-kfac'"):
        make_inputs("noisy-kfac")
    with pytest.raises(ValueError, match="got 'kfac'"):
        make_laplace_inputs("kfac")
    with pytest.raises(ValueError, match="method: expected one of noisy-kfac, kfac, got 'swag'"):
        make_noisy_kfac_inputs("swag")
    with pytest.raises(ValueError, match="got 'ktied'"):
        make_inputs("ktied")
    with pytest.raises(ValueError, match="got 'ktied'"):
        make_noisy_kfac_inputs("ktied")
    with pytest.raises(ValueError, match="method: expected 'ktied', got 'kfac'"):
        make_ktied_inputs("kfac")
    with pytest.raises(TypeError):  # the SWAG trace takes no method: it is the only one
        make_swag_inputs("swag")


# ------------------------------------------------------------------------- the Noisy K-FAC trace

NK_LAYERS = [(0, 24, 6, 4), (24, 34, 5, 2)]  # MLP([5, 4, 2]): (start, stop, n_in + 1, n_out)
NK_CONFIG = {"N": 50, "eta": 0.2, "kl_weight": 0.5, "alpha": 0.1, "beta": 0.2, "momentum": 0.9,
             "gamma_ex": 0.01, "T_stats": 1, "T_inv": 1}


def _nk_settings(method, opts):
    """The options with the documented defaults filled in (kfac: S = 1, no eps)."""
    o = {"seed": 0, "M": 8, "S": 2, "curvature": "ggn", "damping": "factored", "kl-clip": None,
         **opts}
    if method == "kfac":
        o["S"] = 1
    return o


def _nk_draws(method, o):
    """The module docstring's draws, re-drawn here in its order (not by calling trace); u only
    for curvature "mc" (the labels it gives depend on the step's draws: _nk_by_hand)."""
    rng = np.random.default_rng(o["seed"])
    mu = 0.5 * rng.standard_normal(34)
    m = 0.05 * rng.standard_normal(34)
    factors = []
    for n in (6, 5, 4, 2):  # A_1, A_2, then S_1, S_2
        B = rng.standard_normal((n, n))
        factors.append(B @ B.T / n + np.eye(n) / 2)
    idx = rng.permutation(50)[:o["M"]]
    eps = rng.standard_normal((34, o["S"])) if method == "noisy-kfac" else None
    u = rng.random((o["S"], o["M"])) if o["curvature"] == "mc" else None
    return {"mu": mu, "m": m, "A": factors[:2], "S": factors[2:], "idx": idx, "eps": eps, "u": u}


def _nk_forward(theta, X):
    """MLP([5, 4, 2], tanh) written out: (a~_1, h, a~_2, f), W_l row-major, bias last."""
    W1, W2 = theta[:24].reshape(6, 4), theta[24:].reshape(5, 2)
    a1 = np.hstack([X, np.ones((X.shape[0], 1))])
    h = np.tanh(a1 @ W1)
    a2 = np.hstack([h, np.ones((X.shape[0], 1))])
    return a1, h, a2, a2 @ W2


def _softmax(f):
    e = np.exp(f - f.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _nk_by_hand(method, draws, o):
    """The step from the equations of derivations/noisy_kfac.md and the module docstring's
    sampling map, in dense NumPy (np.kron, explicit inverses and solves, the softmax network's
    gradients and curvature by hand): no refbayes call."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    idx = draws["idx"]
    Xb, yb = X[idx], y[idx].astype(int)
    M, S = len(idx), o["S"]
    c = NK_CONFIG
    g_in = c["kl_weight"] / (c["N"] * c["eta"])                                    # (noisy_kfac.2)
    gamma = g_in + c["gamma_ex"]
    mu0, m0, A0, S0 = draws["mu"], draws["m"], draws["A"], draws["S"]
    factored = o["damping"] == "factored"
    pi = [np.sqrt((np.trace(A) / A.shape[0]) / (np.trace(Sf) / Sf.shape[0]))      # (noisy_kfac.5)
          for A, Sf in zip(A0, S0)]
    if draws["eps"] is None:
        w = mu0[:, None]
    else:
        w = np.empty((34, S))
        for (a, b, n, k), A, Sf, p in zip(NK_LAYERS, A0, S0, pi):
            if factored:  # vec_row(L_A^{-T} E L_S^{-1}) = (L_A^{-T} kron L_S^{-T}) vec_row(E)
                d = np.sqrt(g_in)
                LA = np.linalg.cholesky(A + p * d * np.eye(n))
                LS = np.linalg.cholesky(Sf + d / p * np.eye(k))
                T = np.kron(np.linalg.inv(LA).T, np.linalg.inv(LS).T)
                Z = T @ draws["eps"][a:b]
            else:  # the symmetric root (Q_A kron Q_S) Lam^{-1/2} (Q_A kron Q_S)^T
                lA, QA = np.linalg.eigh(A)
                lS, QS = np.linalg.eigh(Sf)
                Lam = (np.outer(lA, lS) + g_in).reshape(-1)
                Q = np.kron(QA, QS)
                Z = Q @ ((Q.T @ draws["eps"][a:b]) / np.sqrt(Lam)[:, None])
            w[a:b] = mu0[a:b, None] + np.sqrt(c["kl_weight"] / c["N"]) * Z        # (noisy_kfac.7)
    probs = y_tilde = None
    if draws["u"] is not None:  # the inverse CDF of the predictive at the step's draws
        probs = np.stack([_softmax(_nk_forward(w[:, s], Xb)[3]) for s in range(S)])
        y_tilde = np.minimum((np.cumsum(probs, axis=-1) <= draws["u"][..., None]).sum(-1), 1)
    grads, A_hat, S_hat = [], [0.0, 0.0], [0.0, 0.0]
    for s in range(S):
        a1, h, a2, f = _nk_forward(w[:, s], Xb)
        p = _softmax(f)
        W2 = w[24:, s].reshape(5, 2)[:4]  # the hidden-to-output weights, bias row dropped
        r = p - np.eye(2)[yb]  # dl_i / df_i
        ds1 = (r @ W2.T) * (1 - h ** 2)
        grads.append(np.concatenate([(a1.T @ ds1).ravel(), (a2.T @ r).ravel()]))
        A_hat[0] = A_hat[0] + a1.T @ a1 / (M * S)                                  # (noisy_kfac.3)
        A_hat[1] = A_hat[1] + a2.T @ a2 / (M * S)
        if o["curvature"] == "ggn":  # sum_i J_i^T H_i J_i, H_i = diag(p_i) - p_i p_i^T
            H = np.stack([np.diag(q) - np.outer(q, q) for q in p])
            J = (1 - h ** 2)[:, :, None] * W2[None]  # d f / d s_1, (M, 4, 2)
            S_hat[0] = S_hat[0] + np.einsum("mik,mkl,mjl->ij", J, H, J) / (M * S)
            S_hat[1] = S_hat[1] + H.sum(axis=0) / (M * S)
        else:  # ef: the true labels; mc: the sampled ones
            labels = yb if o["curvature"] == "ef" else y_tilde[s]
            g2 = p - np.eye(2)[labels]
            g1 = (g2 @ W2.T) * (1 - h ** 2)
            S_hat[0] = S_hat[0] + g1.T @ g1 / (M * S)
            S_hat[1] = S_hat[1] + g2.T @ g2 / (M * S)
    V = np.mean(grads, axis=0) / M + g_in * w.mean(axis=1)                         # (noisy_kfac.8)
    P = np.empty(34)
    for (a, b, n, k), A, Sf, p in zip(NK_LAYERS, A0, S0, pi):
        if factored:
            r = np.sqrt(gamma)
            K = np.kron(A + p * r * np.eye(n), Sf + r / p * np.eye(k))
        else:
            K = np.kron(A, Sf) + gamma * np.eye(n * k)
        P[a:b] = np.linalg.solve(K, V[a:b])                                        # (noisy_kfac.9)
    nu = 1.0
    if o["kl-clip"] is not None:
        nu = min(1.0, np.sqrt(o["kl-clip"] / (c["alpha"] ** 2 * (V @ P))))         # (noisy_kfac.10)
        P = nu * P
    m = c["momentum"] * m0 + P                                                     # (noisy_kfac.11)
    beta = c["beta"]
    return {"probs": probs, "y_tilde": y_tilde,
            "pi": np.array(pi) if factored else None, "w": w, "V": V, "P": P, "m": m,
            "mu": mu0 - c["alpha"] * m, "A_hat": A_hat, "S_hat": S_hat, "nu": nu,
            "A": [(1 - beta) * F + beta * Hh for F, Hh in zip(A0, A_hat)],         # (noisy_kfac.4)
            "S": [(1 - beta) * F + beta * Hh for F, Hh in zip(S0, S_hat)]}


def _flat(d: dict) -> dict:
    """{field: value} with each tuple / list of per-layer arrays as 'field.l', None dropped."""
    out = {}
    for name, value in d.items():
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            out.update({f"{name}.{l}": np.asarray(v) for l, v in enumerate(value)})
        else:
            out[name] = np.asarray(value)
    return out


def _nk_library(t):
    """The step by a direct call of noisy_kfac.step on the trace's inputs, and pi by
    kron.factored_damping_pi: {output name: value} in the trace's order."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    model = MLP([5, 4, 2], activation="tanh", likelihood="categorical")
    i = t.inputs
    state = noisy_kfac.NoisyKFACState(
        i["input.state.mu"], i["input.state.m"],
        *(tuple(i[f"input.state.{k}.{l}"] for l in range(2)) for k in ("A", "S", "A_ref", "S_ref")),
        int(i["input.state.t"]))
    cfg = noisy_kfac.NoisyKFACConfig(**t.config)
    idx = i["input.batch.idx"][0]  # step 1's inputs
    step1 = {n: i[n][0] for n in ("input.eps", "input.y_tilde") if n in i}
    new, info = noisy_kfac.step(state, Batch(X[idx], y[idx]), step1.get("input.eps"), cfg, model,
                                y_tilde=step1.get("input.y_tilde"))
    pi = None
    if cfg.damping == "factored":
        pi = np.array([float(kron.factored_damping_pi(A, S))
                       for A, S in zip(state.A_ref, state.S_ref)])
    assert all(np.array_equal(a, b) for a, b in zip(new.A_ref + new.S_ref, new.A + new.S))
    return _flat({"pi": pi, **info._asdict(), "A": new.A, "S": new.S})


NK_CASES = [
    ("noisy-kfac", {}),
    ("noisy-kfac", {"curvature": "mc", "S": 3, "M": 5, "seed": 2}),  # the official estimator
    ("noisy-kfac", {"damping": "exact", "curvature": "ef", "S": 1, "seed": 4}),
    ("noisy-kfac", {"damping": "exact", "curvature": "mc", "kl_clip": 1e-4}),  # clipping active
    ("noisy-kfac", {"M": 50, "kl_clip": 1.0}),  # full batch; the bound far above: nu = 1
    ("kfac", {}),
    ("kfac", {"curvature": "mc", "damping": "exact", "M": 3, "seed": 9}),
    ("kfac", {"curvature": "ef", "kl_clip": 1e-5}),
]


@pytest.mark.parametrize("method, opts", NK_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(NK_CASES)])
def test_noisy_kfac_outputs_equal_a_direct_step_and_the_equations(method, opts):
    t = _built(method, **opts)
    o = _nk_settings(method, {("kl-clip" if k == "kl_clip" else k): v for k, v in opts.items()})
    assert t.method == method and t.options["seed"] == o["seed"]
    X, y, _ = make_logistic_regression(50, 5, 0)
    idx = t.inputs["input.batch.idx"]  # (K, M): the minibatch itself is input.batch.X, .y
    np.testing.assert_array_equal(t.inputs["input.batch.X"], X[idx])
    np.testing.assert_array_equal(t.inputs["input.batch.y"], y[idx])
    assert t.model["D"] == 34 and t.model["sizes"] == [5, 4, 2]
    assert t.config == {**NK_CONFIG, "damping": o["damping"], "curvature": o["curvature"],
                        "kl_clip": o["kl-clip"], "weight_decay": 0.0,  # gd-zhang's step
                        "sampler_damping": "intrinsic", "refresh_order": "after",
                        "momentum_type": "preconditioned"}
    # the draws are the documented ones, in the documented order
    draws = _nk_draws(method, o)
    i = t.inputs
    assert int(i["input.state.t"]) == 0
    for name in ("mu", "m"):
        np.testing.assert_array_equal(i[f"input.state.{name}"], draws[name])
    for name in ("A", "S"):
        for l, F in enumerate(draws[name]):
            np.testing.assert_array_equal(i[f"input.state.{name}.{l}"], F)
            np.testing.assert_array_equal(i[f"input.state.{name}_ref.{l}"], F)
            assert np.linalg.eigvalsh(F).min() >= 0.5 and not np.allclose(F, np.eye(len(F)))
    for name in ("idx", "eps", "u"):
        key = "input.batch.idx" if name == "idx" else f"input.{name}"
        if draws[name] is None:
            assert key not in i
        else:  # step 1's row
            np.testing.assert_array_equal(i[key][0], draws[name], err_msg=name)
    library, by_hand = _nk_library(t), _flat(_nk_by_hand(method, draws, o))
    # the sampled labels: the inverse CDF of the predictive at the step's own draws
    if o["curvature"] == "mc":
        np.testing.assert_array_equal(i["input.y_tilde"][0], by_hand.pop("y_tilde"))
        assert_close(i["input.probs"][0], by_hand.pop("probs"), EXACT_F64, "probs")
    else:
        assert "input.y_tilde" not in i and "input.probs" not in i
    state_out = ["state.A_ref.0", "state.A_ref.1", "state.S_ref.0", "state.S_ref.1", "state.t"]
    assert list(t.outputs) == list(library) + state_out and list(library) == list(by_hand)
    for name in state_out[:4]:  # T_inv = 1: every step refreshes, A_ref = A
        np.testing.assert_array_equal(t.outputs[name], t.outputs[name[6:].replace("_ref", "")])
    np.testing.assert_array_equal(t.outputs["state.t"], np.arange(1, t.options["steps"] + 1))
    assert ("pi" in t.outputs) == (o["damping"] == "factored")  # exact damping has no split
    for name, value in library.items():
        saved = t.outputs[name][0]
        assert saved.shape == value.shape, name
        np.testing.assert_array_equal(saved, value, err_msg=name)  # bit for bit
        assert_close(saved, by_hand[name], EXACT_F64, f"{method} {name} vs the equations")
    if o["kl-clip"] is not None and o["kl-clip"] < 1e-3:
        assert t.outputs["nu"][0] < 1  # the clipping acts, and the by-hand nu agrees
    else:
        assert t.outputs["nu"][0] == 1.0
    if method == "kfac":
        np.testing.assert_array_equal(t.outputs["w"][0], i["input.state.mu"][:, None])


def test_noisy_kfac_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "noisy-kfac", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("input.state.mu", "input.state.m", "input.state.A.0", "input.state.S.1",
                 "input.batch.idx", "input.eps", "w", "P"):
        assert A[name] != C[name], name


def test_kfac_takes_no_draws():
    """kfac's inputs hold no eps and S = 1; asking it for draws is an error, not ignored."""
    inputs = make_noisy_kfac_inputs("kfac", S=1)
    assert inputs.eps is None and inputs.u is None
    with pytest.raises(ValueError, match=r"S: kfac draws no weights \(eps = None, S = 1\), got 3"):
        make_noisy_kfac_inputs("kfac", S=3)
    assert make_noisy_kfac_inputs("noisy-kfac").eps.shape == (34, 2)  # the default S
    assert "input.eps" not in _built("kfac").inputs


def test_noisy_kfac_step_two_preconditions_with_step_one_factors():
    """Issue 35, item 11. Step 1 preconditions with the drawn factors (the last refresh), so its
    P, m and mu are the same under ggn, ef and mc; with T_inv = 1 step 2 preconditions with
    step 1's refresh, so its P depends on the curvature. Step 2 is noisy_kfac.step from step
    1's state on the draws of default_rng([seed, 1]), and its pi is the split of step 1's
    factors: the mean step's pi, not only the first sampler's."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    model = MLP([5, 4, 2], activation="tanh", likelihood="categorical")
    for method in ("noisy-kfac", "kfac"):
        traces = {c: _built(method, curvature=c) for c in noisy_kfac.CURVATURES}
        assert all(t.options["steps"] == 2 for t in traces.values())  # the default
        P = {c: t.outputs["P"] for c, t in traces.items()}
        for name in ("P", "m", "mu"):
            assert all(np.array_equal(t.outputs[name][0], traces["ggn"].outputs[name][0])
                       for t in traces.values()), name
        for a, b in itertools.combinations(noisy_kfac.CURVATURES, 2):
            assert np.max(np.abs(P[a][1] - P[b][1])) > 1e-6 * np.max(np.abs(P[a][1])), (a, b)
        for curvature, t in traces.items():
            out, i = t.outputs, t.inputs
            rng = np.random.default_rng([0, 1])
            idx = rng.permutation(50)[:8]
            np.testing.assert_array_equal(i["input.batch.idx"][1], idx)
            if method == "noisy-kfac":
                np.testing.assert_array_equal(i["input.eps"][1], rng.standard_normal((34, 2)))
            if curvature == "mc":
                np.testing.assert_array_equal(i["input.u"][1], rng.random(i["input.u"][1].shape))
            A1 = tuple(out[f"A.{l}"][0] for l in range(2))
            S1 = tuple(out[f"S.{l}"][0] for l in range(2))
            state = noisy_kfac.NoisyKFACState(out["mu"][0], out["m"][0], A1, S1, A1, S1, 1)
            cfg = noisy_kfac.NoisyKFACConfig(**t.config)
            _, info = noisy_kfac.step(state, Batch(X[idx], y[idx]), i["input.eps"][1]
                                      if "input.eps" in i else None, cfg, model,
                                      y_tilde=i["input.y_tilde"][1] if "input.y_tilde" in i
                                      else None)
            for name in ("w", "V", "P", "m", "mu"):
                np.testing.assert_array_equal(out[name][1], getattr(info, name), err_msg=name)
            pi = [kron.factored_damping_pi(A, S) for A, S in zip(A1, S1)]
            np.testing.assert_array_equal(out["pi"][1], pi)
        # one step is the first step of two: any prefix of a K-step trace is the shorter trace
        one = _built(method, steps=1)
        for name, a in one.outputs.items():
            np.testing.assert_array_equal(a[0], traces["ggn"].outputs[name][0], err_msg=name)


def test_noisy_kfac_trace_states_the_update_order():
    """The printed trace and the manifest say which factors precondition each step, and that
    the order is the official code's, not Algorithm 2's."""
    for method in ("noisy-kfac", "kfac"):
        t = _built(method)
        note = t.manifest["note"]
        assert "LAST refresh" in note and "not Algorithm 2's" in note and "official" in note
        assert f"order: {note}" in format_trace(t).splitlines()
    assert all(not _built(m).manifest["note"] for m in METHODS if m not in ("noisy-kfac", "kfac"))


# ----------------------------------------------------------------------------- the k-tied trace

KT_SIZES = (4, 5, 3)  # MLP([4, 5, 3]): W_1 (4, 5), b_1 (5,), W_2 (5, 3), b_2 (3,); D = 43


def _kt_problem():
    """The module docstring's recipe, re-drawn here (not by calling trace)."""
    prng = np.random.default_rng(0)
    X = prng.standard_normal((30, 4))
    W = prng.standard_normal((4, 3))
    y = np.argmax(X @ W + prng.standard_normal((30, 3)), axis=1)
    return X, y


def _kt_layout(k):
    """[(theta W slice, theta b slice, rho R^U slice, rho R^V slice, rho r^b slice, m, n)] and P,
    by hand: theta is W_1 row-major, b_1, W_2, b_2; rho is vec R^U_1, vec R^V_1, r^b_1, ..."""
    layers, t, r = [], 0, 0
    for m, n in zip(KT_SIZES[:-1], KT_SIZES[1:]):
        layers.append((slice(t, t + m * n), slice(t + m * n, t + m * n + n),
                       slice(r, r + m * k), slice(r + m * k, r + (m + n) * k),
                       slice(r + (m + n) * k, r + (m + n) * k + n), m, n))
        t, r = t + m * n + n, r + (m + n) * k + n
    return layers, r


def _kt_settings(opts):
    """The options with the documented defaults filled in."""
    return {"seed": 0, "M": 8, "S": 1, "k": 2, **opts}


def _kt_draws(o):
    """The module docstring's draws, re-drawn here in its order (not by calling trace)."""
    P = _kt_layout(o["k"])[1]
    rng = np.random.default_rng(o["seed"])
    mu = 0.5 * rng.standard_normal(43)
    xi = rng.standard_normal(P)
    idx = rng.permutation(30)[:o["M"]]
    eps = rng.standard_normal((43, o["S"]))
    return {"mu": mu, "xi": xi, "idx": idx, "eps": eps}


def _softplus(r):
    return np.logaddexp(0.0, r)


def _sigmoid(r):
    return 1.0 / (1.0 + np.exp(-r))


def _kt_factors(rho, k):
    """[(U_l, V_l, softplus(r^b_l))] from rho, by hand.  (ktied.1)"""
    return [(_softplus(rho[su]).reshape(m, k), _softplus(rho[sv]).reshape(n, k), _softplus(rho[sb]))
            for _, _, su, sv, sb, m, n in _kt_layout(k)[0]]


def _kt_by_hand(draws, o):
    """The start (ktied.8) and the step (ktied.1)-(ktied.7) from the equations of
    derivations/ktied.md and bbb.md, in dense NumPy (the tanh-softmax network's gradient by hand,
    Adam written out): no refbayes call."""
    X, y = _kt_problem()
    k, S, N = o["k"], o["S"], 30
    layers, P = _kt_layout(k)
    idx, eps, mu = draws["idx"], draws["eps"], draws["mu"]
    Xb, yb = X[idx], y[idx]
    M = len(idx)
    start = np.empty(P)
    for _, _, su, sv, sb, _, _ in layers:  # U_l V_l^T = sigma0 = 0.3 everywhere (ktied.8)
        start[su] = start[sv] = np.sqrt(0.3 / k)
        start[sb] = 0.3
    rho = np.log(np.expm1(start)) + 0.5 * draws["xi"]                            # (ktied.8)
    factors = _kt_factors(rho, k)
    sigma = np.empty(43)
    for (sw, sb_t, *_), (U, V, sb) in zip(layers, factors):
        sigma[sw] = (U @ V.T).ravel()                                            # (ktied.1)
        sigma[sb_t] = sb
    theta = mu[:, None] + sigma[:, None] * eps                                   # (ktied.2)
    g, losses = [], []
    for s in range(S):
        w = theta[:, s]
        W1, b1 = w[0:20].reshape(4, 5), w[20:25]
        W2, b2 = w[25:40].reshape(5, 3), w[40:43]
        h = np.tanh(Xb @ W1 + b1)
        f = h @ W2 + b2
        f = f - f.max(axis=1, keepdims=True)
        logp = f - np.log(np.exp(f).sum(axis=1, keepdims=True))
        losses.append(-logp[np.arange(M), yb].sum())
        r = np.exp(logp) - np.eye(3)[yb]  # dl_i / df_i
        ds = (r @ W2.T) * (1 - h ** 2)
        g.append(np.concatenate([(Xb.T @ ds).ravel(), ds.sum(0), (h.T @ r).ravel(), r.sum(0)]))
    g = np.array(g)                                                              # (bbb.4)
    c = N / (M * S)
    g_hat = c * g.sum(axis=0)                                                    # (bbb.5)
    g_sigma = c * (g * eps.T).sum(axis=0)                                        # (ktied.5)
    kl = 0.5 * np.sum(sigma ** 2 + mu ** 2 - 1.0 - 2.0 * np.log(sigma))  # lam = 1 (ktied.4)
    grad_mu = g_hat + mu                                                         # (bbb.9)
    grad_sigma = g_sigma + sigma - 1.0 / sigma                                   # (ktied.5)
    grad_rho = np.empty(P)
    for (sw, sb_t, su, sv, sb, m, n), (U, V, _) in zip(layers, factors):
        G = grad_sigma[sw].reshape(m, n)                                         # (ktied.6)
        grad_rho[su] = ((G @ V) * _sigmoid(rho[su]).reshape(m, k)).ravel()
        grad_rho[sv] = ((G.T @ U) * _sigmoid(rho[sv]).reshape(n, k)).ravel()
        grad_rho[sb] = grad_sigma[sb_t] * _sigmoid(rho[sb])
    loss_hat = c * sum(losses)                                                   # (ktied.3)
    gvec = np.concatenate([grad_mu, grad_rho])
    m1, v1 = 0.1 * gvec, 0.001 * gvec ** 2                                  # (adam.1), (adam.2)
    delta = -1e-3 * (m1 / 0.1) / (np.sqrt(v1 / 0.001) + 1e-8)                   # (adam.3), (adam.4)
    return {"rho0": rho, "factors": factors,
            "sigma": sigma, "theta": theta, "g": g, "g_hat": g_hat, "g_sigma": g_sigma, "kl": kl,
            "grad_mu": grad_mu, "grad_sigma": grad_sigma, "grad_rho": grad_rho,
            "loss_hat": loss_hat, "elbo": -(loss_hat + kl), "delta": delta,
            "mu": mu + delta[:43], "rho": rho + delta[43:], "m": m1, "v": v1}    # (ktied.7)


def _kt_library(t):
    """The step by a direct call of ktied.step on the trace's inputs: (new state, {output name:
    value} in the trace's order)."""
    X, y = _kt_problem()
    model = MLP([4, 5, 3], activation="tanh", likelihood="categorical")
    i = t.inputs
    state = ktied.KTiedState(i["input.state.mu"], i["input.state.rho"],
                             AdamState(i["input.state.adam.m"], i["input.state.adam.v"],
                                       int(i["input.state.adam.t"])),
                             int(i["input.state.t"]),
                             (int(i["input.state.k.0"]), int(i["input.state.k.1"])))
    cfg = ktied.KTiedConfig(**t.config)
    idx = i["input.batch.idx"][0]
    np.testing.assert_array_equal(i["input.batch.X"][0], X[idx])
    np.testing.assert_array_equal(i["input.batch.y"][0], y[idx])
    new, info = ktied.step(state, Batch(X[idx], y[idx]), i["input.eps"][0], cfg, model)
    return state, new, {**info._asdict(), "state.adam.m": new.adam.m, "state.adam.v": new.adam.v,
                        "state.adam.t": new.adam.t, "state.t": new.t, "state.k.0": new.k[0],
                        "state.k.1": new.k[1]}


KT_CASES = [
    {},
    {"seed": 3, "M": 30, "S": 3, "k": 1},  # full batch, three draws, the matrix-normal tie
    {"seed": 5, "M": 1, "S": 2, "k": 3},   # one row; k = min(m, n) of layer 2
    {"k": 4},                              # k above layer 2's min(m, n) = 3: still a valid tie
]


@pytest.mark.parametrize("opts", KT_CASES, ids=[f"ktied-{i}" for i in range(len(KT_CASES))])
def test_ktied_outputs_equal_a_direct_step_and_the_equations(opts):
    t = _built("ktied", **opts)
    o = _kt_settings(opts)
    k = o["k"]
    assert t.method == "ktied" and t.options == {"dtype": "float64", "steps": 1, **o}
    # the shipped problem is the documented recipe
    X, y = _kt_problem()
    model, X2, y2 = ktied_problem()
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, y)
    assert y2.dtype == np.int64 and np.bincount(y2).tolist() == [11, 7, 12]
    assert t.model["args"] == {"sizes": [4, 5, 3], "activation": "tanh",
                               "likelihood": "categorical", "noise_precision": 1.0}
    layers, P = _kt_layout(k)
    lay = ktied.layout(model, k)
    assert (lay.P, lay.D, lay.k) == (P, 43, (k, k))
    assert list(lay.u_off) == [s[2].start for s in layers]
    assert list(lay.v_off) == [s[3].start for s in layers]
    assert list(lay.b_off) == [s[4].start for s in layers]
    assert list(lay.w_theta) == [s[0].start for s in layers]
    assert list(lay.b_theta) == [s[1].start for s in layers]
    assert t.config == {"N": 30, "lam": 1.0, "alpha": 1e-3, "beta1": 0.9, "beta2": 0.999,
                        "eps_adam": 1e-8, "kl_weight": 1.0}
    assert (MEAN_SCALE, KT_SIGMA0, KT_JITTER) == (0.5, 0.3, 0.5)
    # the draws are the documented ones, in the documented order; xi is drawn for the start
    draws = _kt_draws(o)
    i = t.inputs
    np.testing.assert_array_equal(i["input.state.mu"], draws["mu"])
    np.testing.assert_array_equal(i["input.batch.idx"][0], draws["idx"])
    np.testing.assert_array_equal(i["input.eps"][0], draws["eps"])
    start = make_ktied_inputs(**o)
    np.testing.assert_array_equal(start.xi, draws["xi"])
    np.testing.assert_array_equal(start.state.rho, i["input.state.rho"])
    # the start: ktied.init of the draws (ktied.8), its positive factors (ktied.1)
    by_hand = _kt_by_hand(draws, o)
    assert (int(i["input.state.t"]), int(i["input.state.adam.t"])) == (0, 0)
    assert (int(i["input.state.k.0"]), int(i["input.state.k.1"])) == (k, k)
    assert not np.any(i["input.state.adam.m"]) and not np.any(i["input.state.adam.v"])
    assert_close(i["input.state.rho"], by_hand["rho0"], EXACT_F64, "rho (ktied.8)")
    state, new, library = _kt_library(t)
    for l, ((U, V, sb), (hU, hV, hsb)) in enumerate(zip(ktied.scale_parameters(state, model),
                                                         by_hand["factors"])):
        for name, a, hand in (("U", U, hU), ("V", V, hV), ("sigma_b", sb, hsb)):
            assert_close(a, hand, EXACT_F64, f"{name}[{l}] (ktied.1)")
        if k >= 2:  # the jitter makes the tie's columns differ
            assert not np.allclose(hU[:, 0], hU[:, 1]) and not np.allclose(hV[:, 0], hV[:, 1])
    # the step: bit for bit a direct ktied.step on the trace's inputs, and the equations
    assert list(t.outputs) == list(library)
    hand = {**by_hand, "state.adam.m": by_hand["m"], "state.adam.v": by_hand["v"],
            "state.adam.t": 1, "state.t": 1, "state.k.0": k, "state.k.1": k}
    for name, value in library.items():
        saved = t.outputs[name][0]
        assert saved.shape == np.shape(value), name
        np.testing.assert_array_equal(saved, value, err_msg=name)  # the same call, bit for bit
        assert_close(saved, hand[name], EXACT_F64, f"ktied {name} vs the equations")
    np.testing.assert_array_equal(t.outputs["mu"][0], new.mu)
    np.testing.assert_array_equal(t.outputs["rho"][0], new.rho)


def test_ktied_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "ktied", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("input.state.mu", "input.state.rho", "input.batch.idx", "input.eps", "grad_rho",
                 "rho"):
        assert A[name] != C[name], name
    # the problem ignores the seed: the rows drawn differ, the rows they index do not
    i3, i4 = _built("ktied", seed=3).inputs, _built("ktied", seed=4).inputs
    X, _ = _kt_problem()
    for inputs in (i3, i4):
        np.testing.assert_array_equal(inputs["input.batch.X"][0], X[inputs["input.batch.idx"][0]])


# ------------------------------------------- issue 35, items 10 and 14: names, scales, conditions

# The one naming rule of derivations/tracing.md ("Names"): the groups every method's inputs
# fall in, and the recipe inputs a section of the note documents by name.
INPUT_GROUPS = re.compile(r"input\.(state\.\w+(\.\w+)*|cfg\.\w+(\.\w+)?|batch\.(idx|X|y)"
                          r"|eps|eps\.\w+|masks\.\d+)")
RECIPE_INPUTS = {"input.X_star", "input.map.theta_map", "input.map.theta0", "input.Omega",
                 "input.u", "input.probs", "input.y_tilde"}
NAME_CASES = [(m, {}) for m in METHODS] + [
    ("noisy-kfac", {"curvature": "mc"}), ("riemannian-laplace", {"subset": "last_layer"}),
    ("slang", {"steps": 2, "dtype": "float32"})]


@pytest.mark.parametrize("method, opts", NAME_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(NAME_CASES)])
def test_every_trace_names_its_inputs_by_the_one_rule(method, opts):
    """input.state.*, input.cfg.<field>, input.batch.X / y (/ idx: the minibatch itself, not the
    whole set to be indexed), input.eps(.*), input.masks.*, and the documented recipe inputs;
    every numeric config field, scalars included, is input.cfg.<field> (0-d for a scalar),
    equal to the manifest's config; the strings are in the manifest only."""
    t = _built(method, **opts)
    for name in t.inputs:
        assert INPUT_GROUPS.fullmatch(name) or name in RECIPE_INPUTS, name
    assert "input.batch.X" in t.inputs and "input.batch.y" in t.inputs
    assert not {"input.X", "input.y", "input.idx"} & set(t.inputs)
    if "input.batch.idx" in t.inputs:  # the rows of the batch are the rows idx of the data
        idx = t.inputs["input.batch.idx"]
        assert t.inputs["input.batch.X"].shape[:idx.ndim] == idx.shape
    for field, value in t.config.items():
        name = f"input.cfg.{field}"
        if isinstance(value, str) or value is None:
            assert name not in t.inputs, name
        else:
            a = t.inputs[name]
            assert a.shape == () and a.item() == value, name
            assert a.dtype.kind in "biuf"
    # the dump of a trace is the trace: verify takes every input, config scalars included
    assert verify.compare(t, {**t.inputs, **t.outputs}).ok


def test_a_config_array_and_nested_configs_are_named_by_their_field():
    t = _built("slang")  # lam is a (D,) array
    assert t.inputs["input.cfg.lam"].shape == (6,)
    adam = _built("adam")  # MAPConfig(N, lam, adam=AdamConfig(alpha, ...)): input.cfg.adam.*
    assert float(adam.inputs["input.cfg.adam.alpha"]) == adam.config["adam.alpha"] == 0.1
    swag_t = _built("swag")  # its second config, SGDConfig, as input.cfg.sgd.*
    assert float(swag_t.inputs["input.cfg.sgd.alpha"]) == swag_t.config["sgd.alpha"]
    assert int(swag_t.inputs["input.cfg.K"]) == swag_t.config["K"] == 4


@pytest.mark.parametrize("method", METHODS)
def test_every_quantity_has_a_scale_phrase_printed_once(method):
    t = _built(method)
    for group in ("inputs", "outputs"):
        for name, meta in t.manifest[group].items():
            assert isinstance(meta["scale"], str) and len(meta["scale"]) > 3, (group, name)
    out = format_trace(t)
    for name, meta in t.manifest["outputs"].items():
        assert out.count(f"\n  {name}: {meta['scale']}\n") == 1, name


def test_the_scale_phrases_tell_a_raw_sum_from_a_scaled_one():
    """Issue 35, item 14: BBB's g (bbb.4) is the raw minibatch sum, g_hat (bbb.5) N / (M S)
    times the sum; VOGN's g_hat is a per-example mean; a Laplace H sums over all N."""
    bbb = _built("bbb").manifest["outputs"]
    assert "unscaled" in bbb["g"]["scale"] and "N / M" in bbb["g"]["scale"]
    assert bbb["g_hat"]["scale"].startswith("N / (M S) times the sum")
    assert _built("vogn").manifest["outputs"]["g_hat"]["scale"].startswith("per-example mean")
    assert _built("laplace").manifest["outputs"]["H"]["scale"].startswith(
        "the sum over all N")
    assert _built("bbb").manifest["outputs"]["mu"]["scale"].startswith("none")


@pytest.mark.parametrize("method", METHODS)
def test_every_float_output_has_a_measured_condition_and_the_rule_is_stated(method):
    """Issue 35, item 14: no trace leaves its conditions null. The float32 methods (now also
    noisy-kfac, kfac and swag) by a float32 run; laplace and riemannian-laplace, float64 only,
    by a float64 run on their inputs rounded to float32; the manifest says which."""
    t = _built(method)
    rule = t.manifest["condition_rule"]
    assert rule == CONDITION_RULES["rounded" if method in ("laplace", "riemannian-laplace")
                                   else "float32"]
    absolute = t.manifest["absolute"]
    for name, a in t.outputs.items():
        kappa = t.condition[name]
        if a.dtype.kind == "f" and name not in absolute:
            assert kappa is not None and kappa >= 1.0, name
        else:
            assert kappa is None, name
    assert f"condition: {rule}" in format_trace(t).splitlines()


def test_the_rounded_condition_sees_the_ill_conditioned_ode():
    """At the official RK45 tolerances the RLA's end points amplify an input perturbation of
    float32 size by far more than at DOP853 1e-12 (derivations/tracing.md, "Condition")."""
    loose = _built("riemannian-laplace").condition
    tight = _built("riemannian-laplace", ode_method="DOP853", rtol=1e-12, atol=1e-12).condition
    assert loose["c"] > 1e3 * tight["c"] and tight["c"] < 100


def test_the_committed_golden_traces_follow_the_current_format():
    for path in sorted((ROOT / "tests" / "golden").glob("*.npz")):
        t = load(path)
        assert t.manifest["format_version"] == FORMAT_VERSION == 2
        assert t.manifest["condition_rule"] and all(
            "scale" in m for g in ("inputs", "outputs") for m in t.manifest[g].values())
        assert not {"input.X", "input.y", "input.idx"} & set(t.inputs), path.name


# ------------------------------------------------------------ the tiny-CNN traces (issue 34)

@pytest.mark.parametrize("model", [tiny_cnn(), tiny_cnn("gaussian", 2, 4.0),
                                   tiny_cnn("bernoulli", 1), lenet5()],
                         ids=["tiny", "tiny-gaussian", "tiny-bernoulli", "lenet5"])
def test_model_spec_of_a_cnn_rebuilds_an_equal_model_through_json(model):
    spec = json.loads(json.dumps(model_spec(model)))  # plain data: as a manifest holds it
    rebuilt = model_from_spec(spec)
    assert rebuilt == model and rebuilt.D == model.D == spec["D"]
    assert repr(rebuilt) == spec["repr"] and rebuilt.shapes == model.shapes
    assert getattr(rebuilt.likelihood, "noise_precision", 1.0) == spec["noise_precision"]
    assert set(spec) == {"class", "repr", "D", "input_shape", "layers", "likelihood",
                         "noise_precision"}


def test_model_spec_writes_each_layer_as_its_type_and_fields():
    spec = model_spec(tiny_cnn())
    assert spec["class"] == "CNN" and spec["input_shape"] == [1, 6, 6] and spec["D"] == 47
    assert spec["layers"] == [
        {"type": "Conv2d", "c_in": 1, "c_out": 2, "kernel": [3, 3], "stride": [1, 1],
         "padding": [0, 0], "bias": True},
        {"type": "Activation", "name": "relu"},
        {"type": "MaxPool2d", "kernel": [2, 2], "stride": [2, 2]},
        {"type": "Flatten"},
        {"type": "Dense", "n_in": 8, "n_out": 3, "bias": True}]
    assert spec["likelihood"] == "categorical" and spec["noise_precision"] == 1.0


def _cnn_spec(**changes):
    spec = json.loads(json.dumps(model_spec(tiny_cnn())))
    spec.update(changes)
    return spec


def _layers(k, **fields):
    layers = _cnn_spec()["layers"]
    layers[k] = {**layers[k], **fields}
    return layers


@pytest.mark.parametrize("spec, message", [
    ("CNN", "model: expected a model spec dict, got 'CNN'"),
    ({k: v for k, v in _cnn_spec().items() if k != "layers"}, "model: the CNN spec lacks layers"),
    ({k: v for k, v in _cnn_spec().items() if k not in ("input_shape", "likelihood")},
     "model: the CNN spec lacks input_shape, likelihood"),
    (_cnn_spec(layers=[]), "model: layers: expected a non-empty list of layer dicts"),
    (_cnn_spec(layers=_layers(0, type="Conv3d")),
     "model: layers[0]: type: expected one of Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense, "
     "Activation, got 'Conv3d'"),
    (_cnn_spec(layers=_layers(4, width=8)),
     "model: layers[4]: Dense has the fields n_in, n_out, bias, got width"),
    (_cnn_spec(layers=_layers(0, c_out=0)), r"model: layers\[0\] \(Conv2d\): c_out"),
    (_cnn_spec(layers=_layers(1, name="gelu")), r"model: layers\[1\] \(Activation\): name"),
    (_cnn_spec(layers=[*_cnn_spec()["layers"][:4], "Dense"]),
     "model: layers[4]: expected a dict with a 'type' and the layer's fields"),
    (_cnn_spec(layers=_layers(4, n_in=9)), "model: the CNN spec does not build: "),
    (_cnn_spec(input_shape=[1, 6]), "model: the CNN spec does not build: input_shape"),
    (_cnn_spec(likelihood="poisson"), "model: the CNN spec does not build: likelihood"),
    (_cnn_spec(D=48), "model: rebuilt CNN.* has D = 47, the trace says 48"),
    (_cnn_spec(**{"class": "ResNet"}), r"model: cannot rebuild .*\(class 'ResNet'; known: MLP, "
                                       r"LogisticRegression, SoftmaxRegression, CNN\)"),
])
def test_model_from_spec_names_what_is_wrong_in_a_cnn_spec(spec, message):
    escaped = message if "\\" in message or ".*" in message else re.escape(message)
    with pytest.raises(ValueError, match=escaped):
        model_from_spec(spec)


def test_the_cnn_problem_is_its_documented_recipe():
    model, X, y = cnn_problem()
    prng = np.random.default_rng(0)
    X_ref = prng.standard_normal((50, 36))
    W = prng.standard_normal((36, 3))
    y_ref = np.argmax(X_ref @ W + prng.standard_normal((50, 3)), axis=1)
    np.testing.assert_array_equal(X, X_ref)
    np.testing.assert_array_equal(y, y_ref)
    assert y.dtype == np.int64 and np.bincount(y).tolist() == [16, 19, 15]
    assert model == tiny_cnn() and model.D == 47
    # a row is a 1x6x6 image flattened row-major: the network reads it as NCHW
    theta = model.init_theta(np.random.default_rng(1))
    assert_close(model.forward(theta, X[:4]), model.forward(theta, X[:4].reshape(4, 1, 6, 6)),
                 EXACT_F64, "rows vs images")


def test_a_cnn_driver_trace_equals_direct_calls_of_the_step():
    """vogn on the tiny CNN: the trace's outputs are vogn.step on its own inputs, step by step,
    with the model rebuilt from the manifest."""
    t = build("vogn", steps=2, model="tiny-cnn")
    model = model_from_spec(t.model)
    assert model == tiny_cnn() and t.inputs["input.state.mu"].shape == (47,)
    state = vogn.VOGNState(*(t.inputs[f"input.state.{f}"] for f in vogn.VOGNState._fields))
    state = state._replace(t=int(state.t))
    cfg = vogn.VOGNConfig(**t.config)
    _, X, y = cnn_problem()
    for k in range(2):
        idx = t.inputs["input.batch.idx"][k]
        np.testing.assert_array_equal(t.inputs["input.batch.X"][k], X[idx])
        np.testing.assert_array_equal(t.inputs["input.batch.y"][k], y[idx])
        state, info = vogn.step(state, Batch(X[idx], y[idx]), t.inputs["input.eps"][k], cfg, model)
        for field in info._fields:
            assert_close(np.asarray(getattr(info, field)), t.outputs[field][k], EXACT_F64,
                         f"step {k + 1} {field}")


def test_the_model_option_is_recorded_only_when_given():
    plain = build("adam")
    assert "model" not in plain.options and "--model" not in plain.manifest["command"]
    assert plain.model["class"] == "MLP"
    cnn = build("adam", model="tiny-cnn")
    assert list(cnn.options)[:4] == ["seed", "steps", "dtype", "model"]
    assert "--dtype float64 --model tiny-cnn --M 8" in cnn.manifest["command"]
    assert cnn.model["class"] == "CNN" and cnn.model["D"] == 47


@pytest.mark.parametrize("method, model, message", [
    ("laplace", "tiny-cnn", "model: laplace is traced on its shipped model only, got 'tiny-cnn'"),
    ("ngvi-full", "tiny-cnn", "model: ngvi-full is traced on its shipped model only, got 'tiny-cnn'"),
    ("vogn", "lenet5", "model: expected one of tiny-cnn for vogn (or none: its shipped model), "
                       "got 'lenet5'"),
])
def test_build_refuses_a_model_the_method_is_not_traced_on(method, model, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(method, model=model)


def test_the_cli_traces_on_the_tiny_cnn_and_refuses_it_where_not_traced(capsys, tmp_path):
    path = tmp_path / "bbb-cnn.npz"
    assert main(["trace", "bbb", "--model", "tiny-cnn", "--save", str(path)]) == 0
    out = capsys.readouterr().out
    assert "--model tiny-cnn" in out and "D = 47" in out
    assert load(path).options["model"] == "tiny-cnn"
    assert main(["trace", "ngvi-full", "--model", "tiny-cnn"]) == 2
    assert "--model: ngvi-full is traced on its shipped model only" in capsys.readouterr().err
    assert main(["trace", "vogn", "--model", "lenet5"]) == 2  # argparse: not a choice
    assert "--model: invalid choice: 'lenet5'" in capsys.readouterr().err


def test_a_float32_cnn_trace_keeps_its_labels_integer():
    t = build("swag", model="tiny-cnn", dtype="float32")
    assert t.inputs["input.batch.y"].dtype == np.int64
    assert t.inputs["input.batch.X"].dtype == np.float32 and t.outputs["theta"].shape == (1, 6, 47)
    assert all(a.dtype == np.float32 for a in t.outputs.values() if a.dtype.kind == "f")


def test_noisy_kfac_on_the_tiny_cnn_draws_its_factors_per_layer_and_its_mc_labels():
    t = build("noisy-kfac", model="tiny-cnn", curvature="mc")
    shapes = {n: t.inputs[n].shape for n in ("input.state.A.0", "input.state.S.0",
                                             "input.state.A.1", "input.state.S.1")}
    assert shapes == {"input.state.A.0": (10, 10), "input.state.S.0": (2, 2),
                      "input.state.A.1": (9, 9), "input.state.S.1": (3, 3)}
    y_tilde = t.inputs["input.y_tilde"]
    assert y_tilde.shape == (2, 2, 8) and y_tilde.min() >= 0 and y_tilde.max() <= 2


def test_a_methods_help_says_whether_it_is_traced_on_the_tiny_cnn(capsys):
    for method, tracer in TRACERS.items():
        assert main(["trace", method, "--help"]) == 0
        out = "".join(capsys.readouterr().out.split())  # argparse may wrap at a hyphen
        assert ("alsotracedontiny-cnn(--modeltiny-cnn" in out) == bool(tracer.models), method
    assert main(["trace", "--help"]) == 0
    out = "".join(capsys.readouterr().out.split())  # textwrap may break at a hyphen too
    assert "--model{tiny-cnn}" in out and "forswag,noisy-kfac,kfac" in out
