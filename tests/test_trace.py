"""`refbayes trace METHOD`: the tag table against the Info comments, the printed trace, and the JSON
against a direct call of the step fed the printed draws."""
import ast
import inspect
import io
import json
import re
import textwrap
import tokenize
from typing import NamedTuple

import numpy as np
import pytest

from refbayes import trace
from refbayes.cli import main
from refbayes.datasets import make_logistic_regression
from refbayes.methods import ngvi, slang
from refbayes.methods._estimates import Batch
from refbayes.models import LogisticRegression
from tests.tolerances import EXACT_F64, assert_close

INFO = {"slang": slang.SLANGInfo, "ngvi-full": ngvi.FullInfo, "ngvi-meanfield": ngvi.MeanFieldInfo}
STATE = {"slang": slang.SLANGState, "ngvi-full": ngvi.FullState,
         "ngvi-meanfield": ngvi.MeanFieldState}


# ----------------------------------------------------------------------------- the tag table

TAG_EXPR = re.compile(r"\(\w+\.\d+\)(?:\s*[-/]\s*\(\w+\.\d+\))*")
LINE_EXPR = re.compile(r"\blines? (\d+(?:, \d+)*)")


def _field_comments(cls) -> dict:
    """{field: its trailing comment} of a NamedTuple class, read from the source."""
    src = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: tok.string
                for tok in tokenize.generate_tokens(io.StringIO(src).readline)
                if tok.type == tokenize.COMMENT}
    body = ast.parse(src).body[0].body
    return {node.target.id: comments.get(node.lineno, "")
            for node in body if isinstance(node, ast.AnnAssign)}


def _line_and_tag(comment: str):
    line = LINE_EXPR.search(comment)
    return (line.group(1) if line else None), ", ".join(TAG_EXPR.findall(comment))


def _mismatches(cls, table: dict) -> list:
    comments = _field_comments(cls)
    if list(comments) != list(table):
        return [f"fields {list(comments)} != table {list(table)}"]
    return [f"{field}: comment {comments[field]!r} gives {_line_and_tag(comments[field])}, "
            f"table {table[field]}"
            for field in table if _line_and_tag(comments[field]) != table[field]]


@pytest.mark.parametrize("method", trace.METHODS)
def test_tag_table_agrees_with_the_info_comments(method):
    assert list(INFO[method]._fields) == list(trace.TAGS[method])
    assert _mismatches(INFO[method], trace.TAGS[method]) == []


class _DriftedInfo(NamedTuple):
    W: object  # line 7 input: (D, L + M S)  (slang.5)
    U: object  # lines 7, 9: U_{t+1}, (D, L)  (slang.4)


def test_tag_check_catches_drift():
    table = {"W": ("7", "(slang.4)"), "U": ("7, 9", "(slang.4)")}
    assert _mismatches(_DriftedInfo, table) == [
        ("W: comment '# line 7 input: (D, L + M S)  (slang.5)' gives ('7', '(slang.5)'), "
         "table ('7', '(slang.4)')")]
    assert _mismatches(_DriftedInfo, {"W": table["W"]})  # a field missing from the table


def test_tag_parser_reads_ranges_and_alternatives():
    assert _line_and_tag("# (D, D)  (ngvi.7)-(ngvi.9)") == (None, "(ngvi.7)-(ngvi.9)")
    assert _line_and_tag("# (D,)  (ngvi.6) / (ngvi.9)") == (None, "(ngvi.6) / (ngvi.9)")
    assert _line_and_tag("# (ngvi.12); delta = 1 - beta_t is line 2") == ("2", "(ngvi.12)")


# ----------------------------------------------------------------------------- the printed trace

def _trace(capsys, *argv):
    assert main(["trace", *argv]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


BLOCK = re.compile(r"^\[(?P<label>[^\]]+)\] (?P<name>\S+) (?P<shape>\([\d, ]*\))$")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]\d+)?")


def _blocks(out: str) -> dict:
    """{name: (label, shape, text of the values)} of every printed block."""
    blocks, current = {}, None
    for line in out.splitlines():
        m = BLOCK.match(line)
        if m:
            current = m["name"]
            blocks[current] = (m["label"], ast.literal_eval(m["shape"]), [])
        elif line.startswith("  ") and current is not None:
            blocks[current][2].append(line)
        else:
            current = None
    return {k: (label, shape, "\n".join(text)) for k, (label, shape, text) in blocks.items()}


def _values(block) -> np.ndarray:
    """A block printed in full, as an array of its shape."""
    _, shape, text = block
    return np.array([float(v) for v in NUMBER.findall(text)]).reshape(shape)


@pytest.mark.parametrize("method", trace.METHODS)
def test_every_field_is_printed_with_its_tag(capsys, method):
    blocks = _blocks(_trace(capsys, method))
    for field in INFO[method]._fields:
        line, tag = trace.TAGS[method][field]
        label = blocks[field][0]
        assert label.endswith(tag) and (line is None or f"line {line} " in label
                                        or f"lines {line} " in label), (field, label)
    info_fields = [name for name in blocks if not name.startswith(("state.", "batch.", "cfg."))
                   and name not in ("idx", "eps")]
    assert info_fields == list(INFO[method]._fields)  # every field, in order


def test_printed_labels_and_shapes_of_the_default_problem(capsys):
    out = _trace(capsys, "slang")
    for header in ["[input] idx (8,)", "[input] eps (6, 1)", "[input] state.U (6, 2)",
                   "[(ngvi.12)] alpha_t ()", "[line 4 (slang.2)] theta (6, 1)",
                   "[line 6 (slang.3)] G (1, 8, 6)", "[line 7 (slang.4)] W (6, 10)",
                   "[lines 7, 9 (slang.4)] U (6, 2)", "[line 13 (slang.8)] mu (6,)"]:
        assert f"\n{header}\n" in out, header
    assert "rng = numpy.random.default_rng(0)" in out
    out = _trace(capsys, "ngvi-full", "--curvature", "exact")
    assert "[(ngvi.10)] Sigma_inv (6, 6)" in out and "[(ngvi.4)] theta (6, 0)" in out
    assert "eps: none" in out and "[input] eps (" not in out
    assert "[(ngvi.15)] prec_diag (6,)" in _trace(capsys, "ngvi-meanfield")


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


def _argv(method, opts, json_path):
    argv = [method, "--precision", "16", "--json", str(json_path)]
    for k, v in opts.items():
        argv += [f"--{k}", str(v)]
    return argv


def _direct_step(method, opts, blocks):
    """The step called directly, from the printed problem spec and the printed draws and state."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    idx = _values(blocks["idx"]).astype(int)
    batch = Batch(X[idx], y[idx])
    np.testing.assert_array_equal(_values(blocks["batch.X"]), batch.X)
    eps = _values(blocks["eps"]) if "eps" in blocks else None
    fields = [f for f in STATE[method]._fields if f != "t"]
    state = STATE[method](*[_values(blocks[f"state.{f}"]) for f in fields], opts.get("t", 0))
    lam = np.ones(6)
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
def test_json_equals_a_direct_step_with_the_printed_draws(capsys, tmp_path, method, opts):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, *_argv(method, opts, path))
    assert out.rstrip().endswith(f"json: {path}")
    blocks = _blocks(out)
    data = json.loads(path.read_text())
    # the draws in the file are the printed ones, bit for bit (16 digits round-trip float64)
    np.testing.assert_array_equal(data["draws"]["idx"], _values(blocks["idx"]))
    if data["draws"]["eps"] is None:
        assert opts.get("curvature") == "exact" and "eps" not in blocks
    else:
        np.testing.assert_array_equal(data["draws"]["eps"], _values(blocks["eps"]))
    _, info = _direct_step(method, opts, blocks)
    assert list(data["info"]) == list(info._fields)
    for field, value in info._asdict().items():
        entry = data["info"][field]
        assert (entry["line"], entry["tag"]) == trace.TAGS[method][field]
        assert entry["shape"] == list(np.shape(value))
        saved = np.asarray(entry["value"], dtype=float).reshape(np.shape(value))
        assert_close(saved, np.asarray(value), EXACT_F64, f"{method} {field}")
        if np.size(value) <= trace.SHOW_ALL:  # printed in full: the print is the saved value
            np.testing.assert_array_equal(_values(blocks[field]), saved)


def test_momentum_shows_after_the_first_step(tmp_path, capsys):
    def info(*opts):
        _trace(capsys, "slang", "--json", str(tmp_path / "t.json"), *opts)
        return {k: np.array(v["value"]) for k, v in
                json.loads((tmp_path / "t.json").read_text())["info"].items()}

    plain = info()
    np.testing.assert_array_equal(plain["direction"], plain["g_tilde"])
    moving = info("--momentum", "0.9", "--t", "3")
    assert not np.allclose(moving["direction"], moving["g_tilde"])


def test_large_arrays_show_their_first_entries_and_norm(tmp_path, capsys):
    path = tmp_path / "t.json"
    out = _trace(capsys, "ngvi-meanfield", "--M", "50", "--S", "5", "--precision", "16",
                 "--json", str(path))
    G = np.array(json.loads(path.read_text())["info"]["G"]["value"])
    assert G.shape == (5, 50, 6)
    _, _, text = _blocks(out)["G"]
    assert text.startswith("  first 10 of 1500 entries (C order): [")
    shown = [float(v) for v in NUMBER.findall(text.split("norm:")[0].split(": ", 1)[1])]
    np.testing.assert_array_equal(shown, G.reshape(-1)[:10])
    norm = float(text.splitlines()[-1].split("norm:")[1])
    assert_close(norm, np.linalg.norm(G), EXACT_F64, "norm")
    assert "batch.X (50, 5)\n  [[" in out  # inputs are printed in full, whatever their size


def test_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "slang", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    assert _blocks(a)["eps"] != _blocks(c)["eps"] and _blocks(a)["idx"] != _blocks(c)["idx"]


@pytest.mark.parametrize("argv, message", [
    (["nosuch"], "method: expected one of slang, ngvi-full, ngvi-meanfield, got 'nosuch'"),
    (["slang", "--M", "0"], "M: expected an integer in [1, 50], got 0"),
    (["slang", "--L", "7"], "L: expected an integer in [1, 6], got 7"),
    (["slang", "--curvature", "hess"], "curvature: SLANG uses the empirical Fisher only"),
    (["ngvi-full", "--curvature", "fisher"], "curvature: expected one of"),
    (["ngvi-full", "--momentum", "1.0"], "cfg.momentum: expected a value in [0.0, 1.0), got 1.0"),
    (["slang", "--precision", "30"], "precision: expected an integer in [0, 17], got 30"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    assert main(["trace", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"refbayes: error: {message}") and out.err.count("\n") == 1


def test_help_lists_trace(capsys):
    assert main(["--help"]) == 0
    assert "trace" in capsys.readouterr().out
    assert main(["trace", "--help"]) == 0
    out = capsys.readouterr().out
    assert "METHOD" in out and "--json" in out and "--precision" in out


def test_json_creates_only_its_own_folder(capsys, tmp_path):
    """--json creates the file's folder when that folder's parent exists, and nothing above it:
    a path whose grandparent is missing is an error naming the path, before any output."""
    path = tmp_path / "new" / "t.json"
    _trace(capsys, "slang", "--json", str(path))
    assert json.loads(path.read_text())["method"] == "slang"
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
