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
import scipy.linalg
from scipy.stats import multivariate_normal

from refbayes import trace
from refbayes.cli import main
from refbayes.datasets import make_logistic_regression
from refbayes.linalg import kron
from refbayes.methods import ktied, laplace, ngvi, noisy_kfac, riemannian_laplace, slang, swag
from refbayes.methods.adam import AdamState
from refbayes.methods._estimates import Batch
from refbayes.models import MLP, LogisticRegression
from tests.test_trace_tags import NOTE_OF, ROOT, _labels
from tests.tolerances import EXACT_F64, ODE_F64, assert_close

INFO = {"slang": slang.SLANGInfo, "ngvi-full": ngvi.FullInfo, "ngvi-meanfield": ngvi.MeanFieldInfo,
        "laplace": trace.LaplaceInfo, "riemannian-laplace": trace.RiemannianLaplaceInfo,
        "swag": trace.SWAGTraceInfo, "noisy-kfac": trace.NoisyKFACTraceInfo,
        "kfac": trace.NoisyKFACTraceInfo, "ktied": trace.KTiedTraceInfo}
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


@pytest.mark.parametrize("method", trace.TABLE_METHODS)
def test_tag_table_agrees_with_the_info_comments(method):
    assert list(INFO[method]._fields) == list(trace.TAGS[method])
    assert _mismatches(INFO[method], trace.TAGS[method]) == []


# Trace fields of the Laplace and SWAG traces that are also fields of a library NamedTuple: the
# trace's tag must be one of the tags the library's own trailing comment gives that field.
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
    **{(m, f): [(noisy_kfac.NoisyKFACInfo, f)] for m in trace.KFAC_METHODS
       for f in noisy_kfac.NoisyKFACInfo._fields},
    **{(m, f): [(noisy_kfac.NoisyKFACState, f)] for m in trace.KFAC_METHODS for f in ("A", "S")},
    **{("ktied", f): [(ktied.KTiedInfo, f)] for f in ktied.KTiedInfo._fields},
    ("ktied", "m"): [(AdamState, "m")],
    ("ktied", "v"): [(AdamState, "v")],
}


def test_the_swag_trace_steps_are_the_library_info_fields():
    """SWAGTraceInfo opens with SGDInfo's fields, then SWAGInfo's, stacked over the steps: a
    field renamed or added in swag.py shows up here (and in the tag check above)."""
    per_step = swag.SGDInfo._fields + swag.SWAGInfo._fields
    assert trace.SWAGTraceInfo._fields[:len(per_step)] == per_step


def test_the_noisy_kfac_trace_is_pi_the_library_info_and_the_new_factors():
    """NoisyKFACTraceInfo is pi, then every NoisyKFACInfo field in its order, then the state's new
    A and S: a field renamed or added in noisy_kfac.py shows up here (and in the tag check)."""
    assert trace.NoisyKFACTraceInfo._fields == ("pi", *noisy_kfac.NoisyKFACInfo._fields, "A", "S")
    assert trace.TAGS["kfac"] == trace.TAGS["noisy-kfac"]


def test_the_ktied_trace_is_the_library_info_and_the_new_adam_moments():
    """KTiedTraceInfo is every KTiedInfo field in its order, then the new state's Adam moments:
    a field renamed or added in ktied.py shows up here (and in the tag check)."""
    assert trace.KTiedTraceInfo._fields == (*ktied.KTiedInfo._fields, "m", "v")


@pytest.mark.parametrize("method, field", sorted(LIBRARY_FIELDS))
def test_laplace_tags_agree_with_the_library_comments(method, field):
    tag = trace.TAGS[method][field][1]
    for cls, name in LIBRARY_FIELDS[(method, field)]:
        library_tags = TAG_EXPR.findall(_field_comments(cls)[name])
        assert tag in library_tags, (cls.__name__, name, library_tags, tag)


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


LAYER = re.compile(r"\[\d+\]$")  # a tuple field prints one block per layer: A_hat[0], A_hat[1]


@pytest.mark.parametrize("method", trace.TABLE_METHODS)
def test_every_field_is_printed_with_its_tag(capsys, method):
    blocks = _blocks(_trace(capsys, method))
    printed = {}  # field -> the labels of its blocks
    for name, block in blocks.items():
        if block[0] != "input":
            printed.setdefault(LAYER.sub("", name), []).append(block[0])
    for field in INFO[method]._fields:
        line, tag = trace.TAGS[method][field]
        for label in printed[field]:
            assert label.endswith(tag) and (line is None or f"line {line} " in label
                                            or f"lines {line} " in label), (field, label)
    assert list(printed) == list(INFO[method]._fields)  # every field, in order


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
    (["nosuch"], "method: expected one of slang, ngvi-full, ngvi-meanfield, laplace, "
                 "riemannian-laplace, swag, noisy-kfac, kfac, ktied, vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam, slang-mlp, got 'nosuch'"),
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
    (["laplace", "--S", "0"], "S: expected an integer in [1, None], got 0"),
    (["laplace", "--seed", "-1"], "seed: expected an integer in [0, None], got -1"),
    (["riemannian-laplace", "--ode-method", "Euler"],
     "ode_method: expected one of RK45, RK23, DOP853 for riemannian-laplace, got 'Euler'"),
    (["riemannian-laplace", "--rtol", "1e-20"], "rtol: expected a value in [2.22"),
    (["riemannian-laplace", "--atol", "-1"], "atol: expected a value in [0.0, inf), got -1.0"),
    (["laplace", "--rtol", "1e-3"], "--rtol: applies to riemannian-laplace only, not laplace"),
    (["laplace", "--M", "4"],
     "--M: applies to slang, ngvi-full, ngvi-meanfield, swag, noisy-kfac, kfac, ktied, "
     "vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam, slang-mlp only, "
     "not laplace"),
    (["riemannian-laplace", "--momentum", "0.5"],
     "--momentum: applies to slang, ngvi-full, ngvi-meanfield, swag only, not riemannian-laplace"),
    (["slang", "--prior-precision", "2"],
     "--prior-precision: applies to laplace, riemannian-laplace only, not slang"),
    (["ngvi-full", "--ode-method", "RK23"],
     "--ode-method: applies to riemannian-laplace only, not ngvi-full"),
    (["swag", "--steps", "1"], "steps: expected an integer in [2, None] (the low-rank covariance "
                               "divides by K' - 1, K' = min(steps, K)), got 1"),
    (["swag", "--K", "1"], "K: expected an integer in [2, None] (the low-rank covariance"),
    (["swag", "--scale", "0"], "scale: expected a value in (0.0, inf), got 0.0"),
    (["swag", "--alpha", "-0.001"], "alpha: expected a value in (0.0, inf), got -0.001"),
    (["swag", "--alpha", "nan"], "alpha: expected a finite real number in (0.0, inf), got nan"),
    (["swag", "--momentum", "1"], "momentum: expected a value in [0.0, 1.0), got 1.0"),
    (["swag", "--M", "51"], "M: expected an integer in [1, 50], got 51"),
    (["swag", "--S", "0"], "S: expected an integer in [1, None], got 0"),
    (["swag", "--seed", "-2"], "seed: expected an integer in [0, None], got -2"),
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
    (["noisy-kfac", "--S", "0"], "S: expected an integer in [1, None], got 0"),
    (["noisy-kfac", "--seed", "-1"], "seed: expected an integer in [0, None], got -1"),
    (["kfac", "--S", "2"], "--S: applies to slang, ngvi-full, ngvi-meanfield, laplace, "
                           "riemannian-laplace, swag, noisy-kfac, ktied, vogn, vadam, vprop, noisy-adam, bbb, slang-mlp only, not kfac"),
    (["noisy-kfac", "--L", "2"], "--L: applies to slang, ngvi-full, ngvi-meanfield, slang-mlp only, "
                                 "not noisy-kfac"),
    (["kfac", "--momentum", "0.5"], "--momentum: applies to slang, ngvi-full, ngvi-meanfield, "
                                    "swag only, not kfac"),
    (["noisy-kfac", "--alpha", "0.1"], "--alpha: applies to swag only, not noisy-kfac"),
    (["slang", "--damping", "exact"], "--damping: applies to noisy-kfac, kfac only, not slang"),
    (["swag", "--kl-clip", "1e-3"], "--kl-clip: applies to noisy-kfac, kfac only, not swag"),
    (["ktied", "--k", "0"], "k: expected an integer in [1, None], got 0"),
    (["ktied", "--M", "31"], "M: expected an integer in [1, 30], got 31"),
    (["ktied", "--M", "0"], "M: expected an integer in [1, 30], got 0"),
    (["ktied", "--S", "0"], "S: expected an integer in [1, None], got 0"),
    (["ktied", "--seed", "-1"], "seed: expected an integer in [0, None], got -1"),
    (["ktied", "--curvature", "ef"], "--curvature: applies to slang, ngvi-full, ngvi-meanfield, "
                                     "laplace, riemannian-laplace, noisy-kfac, kfac, vogn, ogn only, "
                                     "not ktied"),
    (["ktied", "--L", "2"], "--L: applies to slang, ngvi-full, ngvi-meanfield, slang-mlp only, not ktied"),
    (["ktied", "--K", "2"], "--K: applies to swag only, not ktied"),
    (["ktied", "--alpha", "0.1"], "--alpha: applies to swag only, not ktied"),
    (["ktied", "--damping", "exact"], "--damping: applies to noisy-kfac, kfac only, not ktied"),
    (["slang", "--k", "2"], "--k: applies to ktied only, not slang"),
    (["swag", "--k", "2"], "--k: applies to ktied only, not swag"),
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
    for option in ("--prior-precision", "--structure", "--ode-method", "--rtol", "--atol",
                   "--steps", "--K", "--scale", "--alpha", "--damping", "--kl-clip", "--k "):
        assert option in out, option
    assert "laplace" in out and "riemannian-laplace" in out and "swag" in out
    assert "noisy-kfac" in out and "kfac" in out and "ktied" in out


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


# ----------------------------------------------------------------------------- the Laplace traces

def _shipped_problem():
    """The module docstring's recipe, re-drawn here (not by calling trace)."""
    prng = np.random.default_rng(0)
    X = prng.uniform(-3.0, 3.0, (30, 1))
    y = np.sin(X[:, 0]) + prng.standard_normal(30) / 4.0
    model = MLP([1, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=16.0)
    return model, X, y


GRAD_NORM = re.compile(r"\|grad L\(theta_map\)\|_2 = (\S+) \(MAP_GTOL")


def test_laplace_trace_prints_the_problem_inputs_and_tags(capsys):
    out = _trace(capsys, "laplace")
    assert out.startswith("refbayes trace laplace: ")
    for text in ["X = prng.uniform(-3.0, 3.0, (30, 1))", "D = 13, N = 30",
                 "MLP([1, 4, 1], activation='tanh', likelihood='gaussian', noise_precision=16.0)",
                 "X_star = numpy.linspace(-3.0, 3.0, 5)[:, None]",
                 "structure='full', curvature='ggn'",
                 "map: theta0 = model.init_theta(numpy.random.default_rng(0)); "
                 "scipy.optimize.minimize(L-BFGS-B",
                 "draws: rng = numpy.random.default_rng(0), in order: "
                 "eps = rng.standard_normal((13, 2))"]:
        assert text in out, text
    for header in ["[input] X (30, 1)", "[input] y (30,)", "[input] X_star (5, 1)",
                   "[input] theta_map (13,)", "[input] eps (13, 2)",
                   "[(laplace.2)] H (13, 13)", "[(laplace.3)] precision (13, 13)",
                   "[(laplace.4)] theta_s (13, 2)", "[(laplace.5)] log_Z ()",
                   "[(laplace.6)] log_det_ratio ()", "[(laplace.6)] scatter ()",
                   "[(laplace.7)] f_mean (5, 1)", "[(laplace.7)] y_var (5, 1, 1)"]:
        assert f"\n{header}\n" in out, header
    out = _trace(capsys, "laplace", "--structure", "diag", "--S", "3")
    assert "[(laplace.2)] H (13,)" in out and "[(laplace.3)] precision (13,)" in out
    assert "[(laplace.4)] theta_s (13, 3)" in out


LA_CASES = [
    ("laplace", {}),
    ("laplace", {"structure": "diag", "curvature": "hessian", "seed": 3, "S": 3}),
    ("laplace", {"curvature": "ef", "prior-precision": 2.5}),
    ("laplace", {"structure": "kron", "curvature": "ef", "prior-precision": 2.5}),
    # laplace-torch's default (last layer, K-FAC), and the last layer's exact Hessian
    ("laplace", {"subset": "last_layer", "structure": "kron", "S": 3}),
    ("laplace", {"subset": "last_layer", "curvature": "hessian", "prior-precision": 2.5}),
    ("riemannian-laplace", {}),
    ("riemannian-laplace", {"subset": "last_layer", "structure": "diag"}),
    # ODE_F64's setting (DOP853, rtol = atol = 1e-12); a stronger prior keeps v, and nfev, small
    ("riemannian-laplace", {"structure": "diag", "curvature": "hessian", "ode-method": "DOP853",
                            "rtol": 1e-12, "atol": 1e-12, "S": 1, "seed": 5,
                            "prior-precision": 2.5}),
]


def _direct_laplace(method, data):
    """Every intermediate, from the recorded inputs, by direct calls of the library (and of the
    model for H and the evidence terms, by their definitions)."""
    model, X, y = _shipped_problem()
    theta_map = np.array(data["map"]["theta_map"])
    eps = np.array(data["draws"]["eps"])
    X_star = np.array(data["problem"]["X_star"])
    c = data["config"]
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
        H = H[c["curvature"]]()[off:, off:]  # the random block (laplace.25)
        delta, mu = delta[off:], theta_map[off:]
        if c["structure"] == "kron":  # (laplace.20): blockdiag(A_l kron B_l) from the model
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
    ode = riemannian_laplace.RiemannianLaplaceConfig(**data["ode"])

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
def test_laplace_json_equals_direct_library_calls(capsys, tmp_path, method, opts):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, *_argv(method, opts, path))
    assert out.rstrip().endswith(f"json: {path}")
    blocks = _blocks(out)
    data = json.loads(path.read_text())
    assert data["method"] == method and data["seed"] == opts.get("seed", 0)
    # the recorded problem is the documented recipe, and the printed inputs are the recorded ones
    model, X, y = _shipped_problem()
    np.testing.assert_array_equal(data["problem"]["X"], X)
    np.testing.assert_array_equal(data["problem"]["y"], y)
    np.testing.assert_array_equal(data["problem"]["X_star"], np.linspace(-3, 3, 5)[:, None])
    for name, recorded in [("X", data["problem"]["X"]), ("y", data["problem"]["y"]),
                           ("theta_map", data["map"]["theta_map"]), ("eps", data["draws"]["eps"])]:
        np.testing.assert_array_equal(_values(blocks[name]), recorded)
    D_q = 5 if opts.get("subset") == "last_layer" else 13
    eps = np.random.default_rng(opts.get("seed", 0)).standard_normal((D_q, opts.get("S", 2)))
    np.testing.assert_array_equal(data["draws"]["eps"], eps)  # the documented draw
    assert data["config"]["prior_precision"] == opts.get("prior-precision", 1.0)
    assert data["config"]["structure"] == opts.get("structure", "full")
    assert data["config"]["curvature"] == opts.get("curvature", "ggn")
    assert data["config"]["subset"] == opts.get("subset", "all")
    if method == "riemannian-laplace":
        assert data["ode"] == {"method": opts.get("ode-method", "RK45"),
                               "rtol": opts.get("rtol", 1e-6), "atol": opts.get("atol", 1e-3)}
    direct = _direct_laplace(method, data)
    assert list(data["info"]) == list(trace.TAGS[method]) == list(direct)
    for field, value in direct.items():
        entry = data["info"][field]
        assert (entry["line"], entry["tag"]) == trace.TAGS[method][field]
        assert entry["shape"] == list(np.shape(value)), field
        saved = np.asarray(entry["value"], dtype=float).reshape(np.shape(value))
        assert_close(saved, np.asarray(value, dtype=float), EXACT_F64, f"{method} {field}")
        if np.size(value) <= trace.SHOW_ALL:  # printed in full: the print is the saved value
            np.testing.assert_array_equal(_values(blocks[field]), saved)
    info = data["info"]
    if method == "laplace":  # the evidence two ways: (laplace.5) and laplace-torch's (laplace.6)
        v = {k: info[k]["value"] for k in info}
        assert_close(v["log_lik"] + v["log_prior"] + D_q / 2 * np.log(2 * np.pi) - v["log_det"] / 2,
                     v["log_Z"], EXACT_F64, "(laplace.5)")
        assert_close(v["log_lik"] - (v["log_det_ratio"] + v["scatter"]) / 2, v["log_Z"],
                     EXACT_F64, "(laplace.6)")
    else:
        assert np.linalg.norm(info["g"]["value"]) < trace.MAP_GTOL  # g = grad L(theta_map) ~ 0
        if data["ode"]["rtol"] == 1e-12:  # ODE_F64's solve conserves (riemannian_laplace.11)
            assert_close(info["speed_1"]["value"], info["speed_0"]["value"], ODE_F64, "speed")


def test_the_printed_map_is_stationary(capsys, tmp_path):
    """The printed |grad L(theta_map)|_2 is below MAP_GTOL, and so is the gradient recomputed
    from the printed theta_map (riemannian-laplace's g is checked in the JSON test)."""
    path = tmp_path / "t.json"
    out = _trace(capsys, "laplace", "--precision", "16", "--json", str(path))
    printed = float(GRAD_NORM.search(out).group(1))
    data = json.loads(path.read_text())
    assert printed == data["map"]["grad_norm"] < trace.MAP_GTOL == data["map"]["gtol"]
    model, X, y = _shipped_problem()
    theta = _values(_blocks(out)["theta_map"])
    grad = model.grad(theta, X, y) + theta  # prior precision 1
    assert np.linalg.norm(grad) < trace.MAP_GTOL
    # a minimum, not a saddle: the Hessian of the negative log joint is positive definite
    assert np.linalg.eigvalsh(model.hessian(theta, X, y) + np.eye(13)).min() > 0


def test_laplace_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "laplace", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    assert A["eps"] != C["eps"] and A["theta_s"] != C["theta_s"]
    for same in ("theta_map", "H", "precision", "log_Z", "f_var"):  # the MAP ignores the seed
        assert A[same] == C[same], same
    other = _blocks(_trace(capsys, "laplace", "--seed", "3", "--prior-precision", "2"))
    assert other["theta_map"] != A["theta_map"]  # the MAP is refound for the prior


def test_official_tolerances_drift_from_the_conserved_speed(capsys, tmp_path):
    """The solver options reach the solve: at the official defaults (atol = 1e-3) the conserved
    speed (riemannian_laplace.11) drifts far beyond ODE_F64, which a tight solve meets (above)."""
    path = tmp_path / "t.json"
    _trace(capsys, "riemannian-laplace", "--S", "1", "--structure", "diag", "--curvature",
           "hessian", "--seed", "5", "--prior-precision", "2.5", "--precision", "16",
           "--json", str(path))
    info = json.loads(path.read_text())["info"]
    assert abs(info["speed_1"]["value"][0] / info["speed_0"]["value"][0] - 1) > 1e3 * ODE_F64


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


def _swag_library(data):
    """Every intermediate by direct calls of refbayes.methods.swag on the recorded inputs."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    model = LogisticRegression(5)
    d, c = data["draws"], data["config"]
    sgd_cfg, cfg, diag = (swag.SGDConfig(**c["sgd"]), swag.SWAGConfig(**c["swag"]),
                          swag.SWAGConfig(**c["swag_diagonal"]))
    theta0, z1, z2 = (np.array(d[k]) for k in ("theta0", "z1", "z2"))
    opt, state = swag.sgd_init(theta0.copy()), swag.init(theta0, cfg)
    rows = []
    for idx in d["idx"]:
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
        g.append(50 / len(idx) * Xb.T @ (1 / (1 + np.exp(-Xb @ theta)) - yb) + theta)  # (swag.8)
        v = o["momentum"] * v + g[-1]                                                  # (swag.9)
        theta = theta - o["alpha"] * v                                                 # (swag.9)
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
def test_swag_json_equals_direct_library_calls_and_the_equations(capsys, tmp_path, opts):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, *_argv("swag", opts, path))
    assert out.rstrip().endswith(f"json: {path}")
    blocks, data = _blocks(out), json.loads(path.read_text())
    o = _swag_settings(opts)
    assert data["method"] == "swag" and data["seed"] == o["seed"]
    X, y, _ = make_logistic_regression(50, 5, 0)
    np.testing.assert_array_equal(data["problem"]["X"], X)
    np.testing.assert_array_equal(data["problem"]["y"], y)
    assert data["config"] == {
        "steps": o["steps"],
        "sgd": {"N": 50, "lam": 1.0, "alpha": o["alpha"], "momentum": o["momentum"]},
        "swag": {"K": o["K"], "scale": o["scale"], "var_clamp": 1e-30},
        "swag_diagonal": {"K": o["K"], "scale": 1.0, "var_clamp": 1e-30}}
    # the draws are the documented ones, in the documented order, and the printed ones
    draws = _swag_draws(o["seed"], o["steps"], o["M"], o["S"], o["K"])
    assert list(data["draws"]) == list(draws)
    for name, value in draws.items():
        np.testing.assert_array_equal(data["draws"][name], value)
        np.testing.assert_array_equal(_values(blocks[name]), value)
    for name, value in [("X", X), ("y", y)]:
        np.testing.assert_array_equal(_values(blocks[name]), value)
    library, by_hand = _swag_library(data), _swag_by_hand(draws, o)
    assert list(data["info"]) == list(trace.TAGS["swag"]) == list(library) == list(by_hand)
    for field, value in library.items():
        entry = data["info"][field]
        assert (entry["line"], entry["tag"]) == trace.TAGS["swag"][field]
        assert entry["shape"] == list(np.shape(value)), field
        saved = np.asarray(entry["value"], dtype=float).reshape(np.shape(value))
        np.testing.assert_array_equal(saved, value, err_msg=field)  # the same calls, bit for bit
        assert_close(saved, by_hand[field], EXACT_F64, f"swag {field} vs the equations")
        if np.size(value) <= trace.SHOW_ALL:  # printed in full: the print is the saved value
            np.testing.assert_array_equal(_values(blocks[field]), saved)


def test_swag_trace_prints_the_problem_draws_and_tags(capsys):
    out = _trace(capsys, "swag")
    assert out.startswith("refbayes trace swag: 6 steps of refbayes.methods.swag.sgd_step")
    for text in ["make_logistic_regression(n=50, p=5, seed=0)", "D = 6, N = 50",
                 "SGDConfig(N=50, lam=1.0, alpha=0.002, momentum=0.9), i.e. torch.optim.SGD("
                 "lr=0.1, momentum=0.9, weight_decay=0.02) on the mean loss",
                 "SWAGConfig(K=4, scale=0.5, var_clamp=1e-30); SWAG-Diagonal SWAGConfig(K=4, "
                 "scale=1.0, var_clamp=1e-30)", "K' = min(T, K) = 4",
                 "draws: rng = numpy.random.default_rng(0), in order: theta0 = 0.5 * "
                 "rng.standard_normal(6); for each of the 6 steps rng.permutation(50)[:8] (row t "
                 "of idx: step t + 1); z1 = rng.standard_normal((6, 2)); "
                 "z2 = rng.standard_normal((4, 2))"]:
        assert text in out, text
    for header in ["[input] X (50, 5)", "[input] theta0 (6,)", "[input] idx (6, 8)",
                   "[input] z1 (6, 2)", "[input] z2 (4, 2)", "[(swag.8)] g (6, 6)",
                   "[(swag.9)] theta (6, 6)", "[(swag.1)] theta_bar (6, 6)",
                   "[(swag.3)] dev (6, 6)", "[(swag.4)] Sigma_diag (6,)",
                   "[(swag.3)] D_hat (6, 4)", "[(swag.6)] Sigma (6, 6)",
                   "[(swag.7)] theta_s (6, 2)", "[(swag.11)] log_q (2,)",
                   "[(swag.7)] theta_s_diag (6, 2)", "[(swag.11)] log_q_diag (2,)"]:
        assert f"\n{header}\n" in out, header
    # the ring has wrapped: D_hat holds the deviations of snapshots 3..6, the first (zero) is gone
    blocks = _blocks(out)
    assert np.all(_values(blocks["dev"])[0] == 0) and np.all(_values(blocks["D_hat"]) != 0)


def test_swag_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "swag", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("theta0", "idx", "z1", "z2", "theta_s"):
        assert A[name] != C[name], name


def test_builders_name_each_other():
    with pytest.raises(ValueError, match="use make_swag_inputs for 'swag'"):
        trace.make_inputs("swag")
    with pytest.raises(ValueError, match="use make_swag_inputs for 'swag'"):
        trace.make_laplace_inputs("swag")
    with pytest.raises(ValueError, match="use make_laplace_inputs for 'laplace'"):
        trace.make_inputs("laplace")
    with pytest.raises(ValueError, match="use make_noisy_kfac_inputs for 'noisy-kfac'"):
        trace.make_inputs("noisy-kfac")
    with pytest.raises(ValueError, match="use make_noisy_kfac_inputs for 'kfac'"):
        trace.make_laplace_inputs("kfac")
    with pytest.raises(ValueError, match="use make_swag_inputs for 'swag'"):
        trace.make_noisy_kfac_inputs("swag")
    with pytest.raises(ValueError, match="use make_ktied_inputs for 'ktied'"):
        trace.make_inputs("ktied")
    with pytest.raises(ValueError, match="use make_ktied_inputs for 'ktied'"):
        trace.make_noisy_kfac_inputs("ktied")
    with pytest.raises(ValueError, match="use make_noisy_kfac_inputs for 'kfac'"):
        trace.make_ktied_inputs("kfac")


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


def _nk_library(data):
    """The step by a direct call of noisy_kfac.step on the recorded inputs, and pi by
    kron.factored_damping_pi: {field: value} in NoisyKFACTraceInfo's order."""
    X, y, _ = make_logistic_regression(50, 5, 0)
    model = MLP([5, 4, 2], activation="tanh", likelihood="categorical")
    st, d = data["state"], data["draws"]
    state = noisy_kfac.NoisyKFACState(
        np.array(st["mu"]), np.array(st["m"]),
        *(tuple(np.array(F) for F in st[k]) for k in ("A", "S", "A_ref", "S_ref")), st["t"])
    cfg = noisy_kfac.NoisyKFACConfig(**data["config"])
    idx = np.array(d["idx"])
    eps = None if d["eps"] is None else np.array(d["eps"])
    y_tilde = None if d["y_tilde"] is None else np.array(d["y_tilde"], dtype=np.int64)
    new, info = noisy_kfac.step(state, Batch(X[idx], y[idx]), eps, cfg, model, y_tilde=y_tilde)
    pi = None
    if cfg.damping == "factored":
        pi = np.array([float(kron.factored_damping_pi(A, S))
                       for A, S in zip(state.A_ref, state.S_ref)])
    assert all(np.array_equal(a, b) for a, b in zip(new.A_ref + new.S_ref, new.A + new.S))
    return {"pi": pi, **info._asdict(), "A": new.A, "S": new.S}


def _layers(value):
    """A value as a list of arrays (one per layer for a tuple field), or None."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and np.ndim(value[0]) == 2:
        return [np.asarray(v, dtype=float) for v in value]
    return [np.asarray(value, dtype=float)]


NK_CASES = [
    ("noisy-kfac", {}),
    ("noisy-kfac", {"curvature": "mc", "S": 3, "M": 5, "seed": 2}),  # the official estimator
    ("noisy-kfac", {"damping": "exact", "curvature": "ef", "S": 1, "seed": 4}),
    ("noisy-kfac", {"damping": "exact", "curvature": "mc", "kl-clip": 1e-4}),  # clipping active
    ("noisy-kfac", {"M": 50, "kl-clip": 1.0}),  # full batch; the bound far above: nu = 1
    ("kfac", {}),
    ("kfac", {"curvature": "mc", "damping": "exact", "M": 3, "seed": 9}),
    ("kfac", {"curvature": "ef", "kl-clip": 1e-5}),
]


@pytest.mark.parametrize("method, opts", NK_CASES,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(NK_CASES)])
def test_noisy_kfac_json_equals_a_direct_step_and_the_equations(capsys, tmp_path, method, opts):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, *_argv(method, opts, path))
    assert out.rstrip().endswith(f"json: {path}")
    blocks, data = _blocks(out), json.loads(path.read_text())
    o = _nk_settings(method, opts)
    assert data["method"] == method and data["seed"] == o["seed"]
    X, y, _ = make_logistic_regression(50, 5, 0)
    np.testing.assert_array_equal(data["problem"]["X"], X)
    np.testing.assert_array_equal(data["problem"]["y"], y)
    assert data["problem"]["layers"] == [list(b) for b in NK_LAYERS]
    assert data["config"] == {**NK_CONFIG, "damping": o["damping"], "curvature": o["curvature"],
                              "kl_clip": o["kl-clip"]}
    assert data["derived"] == {"gamma_in": 0.5 / (50 * 0.2), "gamma": 0.5 / (50 * 0.2) + 0.01}
    # the draws are the documented ones, in the documented order, and the printed ones
    draws = _nk_draws(method, o)
    st = data["state"]
    assert st["t"] == 0 and st["A_ref"] == st["A"] and st["S_ref"] == st["S"]
    for name in ("mu", "m"):
        np.testing.assert_array_equal(st[name], draws[name])
        np.testing.assert_array_equal(_values(blocks[f"state.{name}"]), draws[name])
    for name in ("A", "S"):
        for l, F in enumerate(draws[name]):
            np.testing.assert_array_equal(st[name][l], F)
            np.testing.assert_array_equal(_values(blocks[f"state.{name}[{l}]"]), F)
            assert np.linalg.eigvalsh(F).min() >= 0.5 and not np.allclose(F, np.eye(len(F)))
    for name in ("idx", "eps", "u"):
        if draws[name] is None:
            assert data["draws"][name] is None and name not in blocks
        else:
            np.testing.assert_array_equal(data["draws"][name], draws[name])
            np.testing.assert_array_equal(_values(blocks[name]), draws[name])
    np.testing.assert_array_equal(_values(blocks["batch.X"]), X[draws["idx"]])
    library, by_hand = _nk_library(data), _nk_by_hand(method, draws, o)
    # the sampled labels: the inverse CDF of the predictive at the step's own draws
    if o["curvature"] == "mc":
        np.testing.assert_array_equal(data["draws"]["y_tilde"], by_hand["y_tilde"])
        np.testing.assert_array_equal(_values(blocks["y_tilde"]), by_hand["y_tilde"])
        assert_close(np.array(data["draws"]["probs"]), by_hand["probs"], EXACT_F64, "probs")
    else:
        assert data["draws"]["y_tilde"] is None and "y_tilde" not in blocks
    assert list(data["info"]) == list(trace.TAGS[method]) == list(library)
    for field, value in library.items():
        entry = data["info"][field]
        assert (entry["line"], entry["tag"]) == trace.TAGS[method][field]
        if value is None:  # pi of exact damping
            assert entry["shape"] is None and entry["value"] is None and field == "pi"
            assert f"] {field}: none (damping 'exact'" in out
            continue
        lib, saved, hand = _layers(value), _layers(entry["value"]), _layers(by_hand[field])
        assert entry["shape"] == ([list(v.shape) for v in lib] if isinstance(value, tuple)
                                  else list(np.shape(value))), field
        names = ([f"{field}[{l}]" for l in range(len(lib))] if isinstance(value, tuple)
                 else [field])
        for name, a, b, c in zip(names, lib, saved, hand):
            np.testing.assert_array_equal(b.reshape(a.shape), a, err_msg=name)  # bit for bit
            assert_close(b.reshape(a.shape), c, EXACT_F64, f"{method} {name} vs the equations")
            np.testing.assert_array_equal(_values(blocks[name]), b.reshape(a.shape))
    info = data["info"]
    if o["kl-clip"] is not None and o["kl-clip"] < 1e-3:
        assert info["nu"]["value"] < 1  # the clipping acts, and the by-hand nu agrees
    else:
        assert info["nu"]["value"] == 1.0
    if method == "kfac":
        np.testing.assert_array_equal(info["w"]["value"], np.array(st["mu"])[:, None])


def test_noisy_kfac_trace_prints_the_problem_draws_and_tags(capsys):
    out = _trace(capsys, "noisy-kfac")
    assert out.startswith("refbayes trace noisy-kfac: one step of "
                          "refbayes.methods.noisy_kfac.step")
    for text in ["make_logistic_regression(n=50, p=5, seed=0)",
                 "MLP([5, 4, 2], activation='tanh', likelihood='categorical'); D = 34, N = 50",
                 "layer 1: theta[0:24], A_1 (6, 6), S_1 (4, 4); layer 2: theta[24:34], "
                 "A_2 (5, 5), S_2 (2, 2)",
                 "gamma_in = kl_weight / (N eta) = 0.05",
                 "draws: rng = numpy.random.default_rng(0), in order: mu = 0.5 * "
                 "rng.standard_normal(34); m = 0.05 * rng.standard_normal(34); A_1 (6, 6), "
                 "A_2 (5, 5), then S_1 (4, 4), S_2 (2, 2), each B @ B.T / n + I / 2 with "
                 "B = rng.standard_normal((n, n)); idx = rng.permutation(50)[:8]; "
                 "eps = rng.standard_normal((34, 2))",
                 "W_s = M + sqrt(kl_weight / N) L_A^{-T} E_s L_S^{-1}"]:
        assert text in out, text
    for header in ["[input] idx (8,)", "[input] eps (34, 2)", "[input] state.m (34,)",
                   "[input] state.A[0] (6, 6)", "[input] state.S[1] (2, 2)",
                   "[(noisy_kfac.5)] pi (2,)", "[(noisy_kfac.7)] w (34, 2)",
                   "[(noisy_kfac.8)] V (34,)", "[(noisy_kfac.9)] P (34,)",
                   "[(noisy_kfac.11)] m (34,)", "[(noisy_kfac.11)] mu (34,)",
                   "[(noisy_kfac.3)] A_hat[0] (6, 6)", "[(noisy_kfac.3)] S_hat[1] (2, 2)",
                   "[(noisy_kfac.10)] nu ()", "[(noisy_kfac.4)] A[1] (5, 5)",
                   "[(noisy_kfac.4)] S[0] (4, 4)"]:
        assert f"\n{header}\n" in out, header
    assert "[input] u (" not in out and "[input] y_tilde (" not in out  # ggn: no labels drawn
    out = _trace(capsys, "kfac", "--curvature", "mc", "--damping", "exact")
    assert out.startswith("refbayes trace kfac: one step of refbayes.methods.noisy_kfac.step "
                          "(eps = None: K-FAC")
    assert "[input] eps: none" in out and "[input] eps (" not in out
    assert "[(noisy_kfac.5)] pi: none (damping 'exact' has no split)" in out
    for header in ["[input] u (1, 8)", "[input] probs (1, 8, 2)", "[input] y_tilde (1, 8)",
                   "[(noisy_kfac.7)] w (34, 1)"]:
        assert f"\n{header}\n" in out, header
    assert "Q_A ((Q_A^T E_s Q_S) / sqrt(Lam)) Q_S^T" in _trace(capsys, "noisy-kfac", "--damping",
                                                               "exact")


def test_noisy_kfac_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "noisy-kfac", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("state.mu", "state.m", "state.A[0]", "state.S[1]", "idx", "eps", "w", "P"):
        assert A[name] != C[name], name


def test_kfac_takes_no_draws():
    """kfac's inputs hold no eps and S = 1; asking it for draws is an error, not ignored."""
    inputs = trace.make_noisy_kfac_inputs("kfac", S=1)
    assert inputs.eps is None and inputs.u is None
    with pytest.raises(ValueError, match=r"S: kfac draws no weights \(eps = None, S = 1\), got 3"):
        trace.make_noisy_kfac_inputs("kfac", S=3)
    assert trace.make_noisy_kfac_inputs("noisy-kfac").eps.shape == (34, 2)  # the default S


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


def _kt_library(data):
    """The step by a direct call of ktied.step on the recorded inputs: (new state, {field:
    value} in KTiedTraceInfo's order)."""
    X, y = np.array(data["problem"]["X"]), np.array(data["problem"]["y"])
    model = MLP([4, 5, 3], activation="tanh", likelihood="categorical")
    st = data["state"]
    state = ktied.KTiedState(np.array(st["mu"]), np.array(st["rho"]),
                             AdamState(np.array(st["adam"]["m"]), np.array(st["adam"]["v"]),
                                       st["adam"]["t"]), st["t"], tuple(st["k"]))
    cfg = ktied.KTiedConfig(**data["config"])
    idx = np.array(data["draws"]["idx"])
    new, info = ktied.step(state, Batch(X[idx], y[idx]), np.array(data["draws"]["eps"]), cfg,
                           model)
    return new, {**info._asdict(), "m": new.adam.m, "v": new.adam.v}


KT_CASES = [
    {},
    {"seed": 3, "M": 30, "S": 3, "k": 1},  # full batch, three draws, the matrix-normal tie
    {"seed": 5, "M": 1, "S": 2, "k": 3},   # one row; k = min(m, n) of layer 2
    {"k": 4},                              # k above layer 2's min(m, n) = 3: still a valid tie
]


@pytest.mark.parametrize("opts", KT_CASES, ids=[f"ktied-{i}" for i in range(len(KT_CASES))])
def test_ktied_json_equals_a_direct_step_and_the_equations(capsys, tmp_path, opts):
    path = tmp_path / "out" / "trace.json"
    out = _trace(capsys, *_argv("ktied", opts, path))
    assert out.rstrip().endswith(f"json: {path}")
    blocks, data = _blocks(out), json.loads(path.read_text())
    o = _kt_settings(opts)
    k = o["k"]
    assert data["method"] == "ktied" and data["seed"] == o["seed"]
    # the recorded problem is the documented recipe, and the printed inputs are the recorded ones
    X, y = _kt_problem()
    np.testing.assert_array_equal(data["problem"]["X"], X)
    np.testing.assert_array_equal(data["problem"]["y"], y)
    assert data["problem"]["model"] == {"class": "refbayes.models.MLP", "sizes": [4, 5, 3],
                                        "activation": "tanh", "likelihood": "categorical"}
    layers, P = _kt_layout(k)
    lay = data["problem"]["layout"]
    assert (lay["P"], lay["D"], lay["k"]) == (P, 43, [k, k])
    assert lay["u_off"] == [s[2].start for s in layers] and lay["b_off"] == [s[4].start
                                                                               for s in layers]
    assert lay["w_theta"] == [s[0].start for s in layers]
    assert data["config"] == {"N": 30, "lam": 1.0, "alpha": 1e-3, "beta1": 0.9, "beta2": 0.999,
                              "eps_adam": 1e-8, "kl_weight": 1.0}
    assert data["init"] == {"mean_scale": 0.5, "k": [k, k], "sigma0": 0.3, "jitter": 0.5}
    # the draws are the documented ones, in the documented order, and the printed ones
    draws = _kt_draws(o)
    for name, value in draws.items():
        np.testing.assert_array_equal(data["draws"][name], value, err_msg=name)
    for name in ("idx", "xi", "eps"):
        np.testing.assert_array_equal(_values(blocks[name]), draws[name], err_msg=name)
    np.testing.assert_array_equal(_values(blocks["batch.X"]), X[draws["idx"]])
    np.testing.assert_array_equal(_values(blocks["batch.y"]), y[draws["idx"]])
    # the start: ktied.init of the draws (ktied.8), its positive factors (ktied.1), printed
    by_hand = _kt_by_hand(draws, o)
    st = data["state"]
    assert (st["t"], st["k"], st["adam"]["t"]) == (0, [k, k], 0)
    assert not np.any(st["adam"]["m"]) and not np.any(st["adam"]["v"])
    np.testing.assert_array_equal(st["mu"], draws["mu"])
    np.testing.assert_array_equal(_values(blocks["state.mu"]), draws["mu"])
    np.testing.assert_array_equal(_values(blocks["state.rho"]), st["rho"])
    assert_close(np.array(st["rho"]), by_hand["rho0"], EXACT_F64, "rho (ktied.8)")
    for l, (U, V, sb) in enumerate(by_hand["factors"]):
        recorded = data["factors"][l]
        for name, hand in (("U", U), ("V", V), ("sigma_b", sb)):
            np.testing.assert_array_equal(_values(blocks[f"state.{name}[{l}]"]),
                                          np.array(recorded[name]), err_msg=f"{name}[{l}]")
            assert_close(np.array(recorded[name]), hand, EXACT_F64, f"{name}[{l}] (ktied.1)")
        if k >= 2:  # the jitter makes the tie's columns differ
            assert not np.allclose(U[:, 0], U[:, 1]) and not np.allclose(V[:, 0], V[:, 1])
    # the step: bit for bit a direct ktied.step on the recorded inputs, and the equations
    new, library = _kt_library(data)
    assert list(data["info"]) == list(trace.TAGS["ktied"]) == list(library)
    for field, value in library.items():
        entry = data["info"][field]
        assert (entry["line"], entry["tag"]) == trace.TAGS["ktied"][field]
        assert entry["shape"] == list(np.shape(value)), field
        saved = np.asarray(entry["value"], dtype=float).reshape(np.shape(value))
        np.testing.assert_array_equal(saved, value, err_msg=field)  # the same call, bit for bit
        assert_close(saved, by_hand[field], EXACT_F64, f"ktied {field} vs the equations")
        assert np.size(value) <= trace.SHOW_ALL  # printed in full: the print is the saved value
        np.testing.assert_array_equal(_values(blocks[field]), saved, err_msg=field)
    ns = data["new_state"]
    assert (ns["t"], ns["k"], ns["adam"]["t"]) == (1, [k, k], 1)
    for name, value in (("mu", new.mu), ("rho", new.rho), ("m", new.adam.m), ("v", new.adam.v)):
        recorded = ns["adam"][name] if name in ("m", "v") else ns[name]
        np.testing.assert_array_equal(recorded, value, err_msg=f"new_state {name}")


def test_ktied_trace_prints_the_problem_draws_and_tags(capsys):
    out = _trace(capsys, "ktied")
    assert out.startswith("refbayes trace ktied: one step of refbayes.methods.ktied.step\n")
    for text in ["prng = numpy.random.default_rng(0); X = prng.standard_normal((30, 4)); "
                 "W = prng.standard_normal((4, 3)); y = argmax(X @ W + "
                 "prng.standard_normal((30, 3)), axis=1)",
                 "MLP([4, 5, 3], activation='tanh', likelihood='categorical'); D = 43, N = 30",
                 "ktied.layout(model, k=(2, 2)), D = 43, P = 42; layer 1: W_1 theta[0:20] (4, 5), "
                 "b_1 theta[20:25]; R^U_1 rho[0:8] (4, 2), R^V_1 rho[8:18] (5, 2), r^b_1 "
                 "rho[18:23]",
                 "KTiedConfig = BBBConfig(N=30, lam=1.0, alpha=0.001, beta1=0.9, beta2=0.999, "
                 "eps_adam=1e-08, kl_weight=1.0)",
                 "ktied.init(mu, model, k=(2, 2), sigma0=0.3, xi, jitter=0.5)",
                 "draws: rng = numpy.random.default_rng(0), in order: mu = 0.5 * "
                 "rng.standard_normal(43); xi = rng.standard_normal(42); "
                 "idx = rng.permutation(30)[:8]; eps = rng.standard_normal((43, 1))",
                 "new state: KTiedState(mu, rho, AdamState(m, v, 1), t = 1, k = (2, 2))"]:
        assert text in out, text
    for header in ["[input] idx (8,)", "[input] batch.X (8, 4)", "[input] batch.y (8,)",
                   "[input] xi (42,)", "[input] eps (43, 1)", "[input] state.mu (43,)",
                   "[input] state.rho (42,)", "[input] state.U[0] (4, 2)",
                   "[input] state.V[0] (5, 2)", "[input] state.sigma_b[0] (5,)",
                   "[input] state.U[1] (5, 2)", "[input] state.V[1] (3, 2)",
                   "[input] state.sigma_b[1] (3,)",
                   "[(ktied.1)] sigma (43,)", "[(ktied.2)] theta (43, 1)", "[(bbb.4)] g (1, 43)",
                   "[(bbb.5)] g_hat (43,)", "[(ktied.5)] g_sigma (43,)", "[(ktied.4)] kl ()",
                   "[(bbb.9)] grad_mu (43,)", "[(ktied.5)] grad_sigma (43,)",
                   "[(ktied.6)] grad_rho (42,)", "[(ktied.3)] loss_hat ()",
                   "[(ktied.3)] elbo ()", "[(ktied.7)] delta (85,)", "[(ktied.7)] mu (43,)",
                   "[(ktied.7)] rho (42,)", "[(adam.1)] m (85,)", "[(adam.2)] v (85,)"]:
        assert f"\n{header}\n" in out, header
    # every tag printed is a numbered equation of its derivation note (ktied.md; bbb.md holds
    # the bbb and adam equations the step reuses)
    tags = {t for label, _, _ in _blocks(out).values() if label != "input"
            for t in re.findall(r"\(([a-z_]+)\.(\d+)\)", label)}
    assert {name for name, _ in tags} == {"ktied", "bbb", "adam"}
    for name, n in tags:
        note = ROOT / "derivations" / f"{NOTE_OF.get(name, name)}.md"
        assert (name, int(n)) in _labels(note), f"({name}.{n}) not numbered in {note.name}"
    assert "(ktied.8)" in out and ("ktied", 8) in _labels(ROOT / "derivations" / "ktied.md")


def test_ktied_same_seed_same_trace_other_seed_other_draws(capsys):
    a, b, c = (_trace(capsys, "ktied", "--seed", s) for s in ("3", "3", "4"))
    assert a == b
    A, C = _blocks(a), _blocks(c)
    for name in ("state.mu", "xi", "state.rho", "state.U[0]", "idx", "eps", "grad_rho", "rho"):
        assert A[name] != C[name], name
    # the problem ignores the seed: the same recipe line (class counts 11, 7, 12) for both
    assert a.splitlines()[1] == c.splitlines()[1] and "class counts 11, 7, 12)" in a
