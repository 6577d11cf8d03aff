"""refbayes verify: the comparison, its tolerance rule, its report, the wrong inputs it must name,
the layouts, the pytest helper and the command line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from refbayes import layout, tracing, verify
from refbayes.cli import main
from refbayes.tracing.files import MANIFEST_KEY
from refbayes.tracing.problems import MAP_GTOL
from tests.tolerances import EXACT_F32, EXACT_F64

GOLDEN = Path(__file__).parent / "golden"
VOGN = GOLDEN / "vogn.npz"


@pytest.fixture(scope="module")
def vogn_trace():
    return tracing.load(VOGN)


def _dump(trace, names=None):
    names = list(trace.outputs) if names is None else names
    return {n: trace.outputs[n].copy() for n in names}


def test_the_trace_itself_agrees_exactly(vogn_trace):
    report = verify.compare(vogn_trace, _dump(vogn_trace))
    assert report.ok and report.first_failure is None and report.not_dumped == []
    assert all(r.max_abs == 0.0 for r in report.rows)
    assert len(report.rows) == 2 * len(vogn_trace.outputs)  # two steps


def test_the_first_divergence_is_the_earliest_in_the_method_order(vogn_trace):
    dump = _dump(vogn_trace)
    dump["h_hat"][0, 5] += 1e-3        # (vogn.5) at step 1
    dump["mu"][0, 2] += 1.0            # later in step 1
    dump["g_hat"][1, 0] += 1.0         # step 2
    report = verify.compare(vogn_trace, dump)
    bad = report.first_failure
    assert (bad.step, bad.name, bad.tag, bad.derivation) == \
        (1, "h_hat", "(vogn.5), (vogn.6)", "derivations/vogn.md")
    assert bad.worst == (5,) and bad.status == "diverges"
    assert bad.max_abs == pytest.approx(1e-3, rel=1e-6)
    assert bad.reference == vogn_trace.outputs["h_hat"][0, 5]
    assert sum(not r.ok for r in report.rows) == 3
    text = str(report)
    assert "FIRST DIVERGENCE: step 1, h_hat (vogn.5), (vogn.6), derived in derivations/vogn.md" \
        in text and "at index (5,)" in text


def test_a_subset_fewer_steps_and_per_step_shapes_are_accepted(vogn_trace):
    dump = {"g_hat": vogn_trace.outputs["g_hat"][:1],     # the first step only, (1, D)
            "mu": vogn_trace.outputs["mu"][0],             # step 1 without its step axis
            "input.eps": vogn_trace.inputs["input.eps"]}   # the inputs fed, checked too
    report = verify.compare(vogn_trace, dump)
    assert report.ok
    assert [(r.name, r.step) for r in report.rows] == \
        [("input.eps", 1), ("input.eps", 2), ("g_hat", 1), ("mu", 1)]
    assert "sigma" in report.not_dumped


def test_tolerance_rule_knows_float32_and_the_measured_condition():
    assert verify.tolerance(np.float64, None) == EXACT_F64
    assert verify.tolerance(np.float32, None) == EXACT_F32
    assert verify.tolerance(np.float64, 1.0) == EXACT_F64          # exact(d) is the floor
    kappa = 1e8                                                     # ill-conditioned quantity
    assert verify.tolerance(np.float64, kappa) == verify.SAFETY * kappa * 2.0 ** -53
    assert verify.tolerance(np.float32, 1e5) == verify.SAFETY * 1e5 * 2.0 ** -24


def test_a_float32_dump_is_held_to_the_float32_rule(vogn_trace):
    dump = {n: a.astype(np.float32) for n, a in _dump(vogn_trace).items()
            if a.dtype.kind == "f"}
    report = verify.compare(vogn_trace, dump)
    assert report.ok
    assert {r.tol for r in report.rows} >= {EXACT_F32}
    dump["mu"] = dump["mu"] * np.float32(1 + 1e-2)  # a 1% error is no float32 rounding
    assert verify.compare(vogn_trace, dump).first_failure.name == "mu"


def test_the_float32_golden_trace_matches_the_float64_one_within_its_rule():
    f32 = tracing.load(GOLDEN / "vogn-float32.npz")
    f64 = tracing.load(VOGN)
    assert verify.compare(f64, {**f32.outputs}).ok


def test_missing_quantities_are_an_error_naming_the_expected_names(vogn_trace):
    n = len(vogn_trace.inputs) + len(vogn_trace.outputs)
    with pytest.raises(ValueError, match=f"yours: none of the {n} quantities of the vogn trace is "
                                         "in the dump .it has loss, theta_hat.; expected names "
                                         "such as N_eff, delta_tilde"):
        verify.compare(vogn_trace, {"loss": np.ones(2), "theta_hat": np.ones(3)})


def test_a_wrong_shape_is_a_failing_row_with_the_expected_shapes(vogn_trace):
    report = verify.compare(vogn_trace, {"g_k": np.zeros((2, 34, 2)), "mu": np.zeros(33)})
    rows = {r.name: r for r in report.rows}
    assert not report.ok and rows["g_k"].status == "shape"
    assert "expected shape (2, 2, 34) (all 2 steps)" in rows["g_k"].detail
    assert "transposed?" in rows["g_k"].detail
    assert "got (33,)" in rows["mu"].detail and "transposed" not in rows["mu"].detail
    assert [r.name for r in report.rows] == ["g_k", "mu"]  # in the method's order
    with pytest.raises(AssertionError, match="SHAPE"):
        verify.assert_matches(vogn_trace, {"mu": np.zeros(33)})


def test_nan_in_a_dump_is_reported_at_its_first_index(vogn_trace):
    dump = _dump(vogn_trace, ["sigma", "m"])
    dump["m"][1, 7] = np.nan
    report = verify.compare(vogn_trace, dump)
    bad = report.first_failure
    assert (bad.name, bad.step, bad.status, bad.worst) == ("m", 2, "non-finite", (7,))
    assert "1 non-finite entries where the trace is finite, first at index (7,)" in bad.detail


def test_integer_quantities_must_be_equal(vogn_trace):
    dump = {"state.t": vogn_trace.outputs["state.t"] + 1}
    bad = verify.compare(vogn_trace, dump).first_failure
    assert bad.name == "state.t" and bad.tol == 0.0
    dump = {"state.t": vogn_trace.outputs["state.t"] + 0.5}
    assert verify.compare(vogn_trace, dump).first_failure.status == "dtype"


def test_a_torch_layout_dump_is_read_with_layout_torch_and_hinted_without(vogn_trace):
    model = tracing.model_from_spec(vogn_trace.model)
    dump = {}
    for name in ("g_k", "h_hat", "theta", "mu"):
        axes = vogn_trace.param_axes[name]
        dump[name] = layout.from_refbayes(vogn_trace.outputs[name], model, "torch", axes=axes)
    assert not np.array_equal(dump["mu"], vogn_trace.outputs["mu"])  # the orders differ
    assert verify.compare(vogn_trace, dump, layout="torch").ok
    report = verify.compare(vogn_trace, dump)
    bad = report.first_failure
    assert bad.name == "theta" and "matches in the 'torch' layout: rerun with --layout torch" \
        in bad.detail
    # the worst index is where the dump holds the entry, in its own (torch) order
    moved = {"mu": dump["mu"].copy()}
    moved["mu"][0, 14] += 1.0  # torch position 14: weight_1[2, 4], refbayes' W_1[4, 2]
    bad = verify.compare(vogn_trace, moved, layout="torch").first_failure
    assert bad.worst == (14,) and bad.yours == pytest.approx(moved["mu"][0, 14])
    # a per-step (step-axis-less) dump converts along the right axis too
    one = {"g_k": dump["g_k"][0]}
    assert verify.compare(vogn_trace, one, layout="torch").ok
    with pytest.raises(ValueError, match="layout: expected one of refbayes, torch, flax"):
        verify.compare(vogn_trace, dump, layout="keras")


def test_slang_u_is_compared_up_to_column_signs():
    trace = tracing.load(GOLDEN / "slang.npz")
    U = trace.outputs["U"].copy()
    U[:, :, 1] *= -1
    assert verify.compare(trace, {"U": U}).ok
    U[0, 0, 0] += 0.1
    assert not verify.compare(trace, {"U": U}).ok


def test_a_trace_from_another_refbayes_version_is_compared_with_a_note(tmp_path, vogn_trace):
    with np.load(VOGN, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    manifest = json.loads(str(arrays[MANIFEST_KEY]))
    manifest["refbayes_version"] = "0.0.9"
    arrays[MANIFEST_KEY] = np.array(json.dumps(manifest))
    np.savez(tmp_path / "old.npz", **arrays)
    report = verify.compare(tmp_path / "old.npz", _dump(vogn_trace, ["mu"]))
    assert report.ok
    assert any("made by refbayes 0.0.9" in n for n in report.notes)


def test_bad_dumps_and_arguments(tmp_path, vogn_trace):
    with pytest.raises(FileNotFoundError, match="yours: no file"):
        verify.compare(vogn_trace, tmp_path / "none.npz")
    with open(tmp_path / "pickled.npz", "wb") as f:
        np.savez(f, a=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="yours: .*pickled.npz is not a readable npz file of numeric arrays"):
        verify.compare(vogn_trace, tmp_path / "pickled.npz")
    with pytest.raises(ValueError, match="yours: mu has dtype <U1; expected a numeric array"):
        verify.compare(vogn_trace, {"mu": np.array(["a"])})
    with pytest.raises(ValueError, match="yours: expected an npz path or a mapping"):
        verify.compare(vogn_trace, [1, 2])
    with pytest.raises(ValueError, match="rtol: expected a positive finite number"):
        verify.compare(vogn_trace, _dump(vogn_trace, ["mu"]), rtol=float("nan"))


def test_assert_matches_raises_with_the_report_and_returns_it_when_ok(vogn_trace):
    assert verify.assert_matches(vogn_trace, _dump(vogn_trace, ["mu"])).ok
    dump = _dump(vogn_trace, ["s"])
    dump["s"][0, 0] *= 2
    with pytest.raises(AssertionError) as err:
        verify.assert_matches(VOGN, dump)
    assert "FIRST DIVERGENCE: step 1, s (vogn.8), derived in derivations/vogn.md" in str(err.value)


def test_cli_exit_status_report_and_json(tmp_path, capsys, vogn_trace):
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    np.savez(good, **_dump(vogn_trace))
    dump = _dump(vogn_trace)
    dump["g_k"][0, 1, 3] += 0.5
    np.savez(bad, **dump)
    assert main(["verify", str(VOGN), str(good)]) == 0
    assert "OK: every compared quantity agrees (28 comparisons)." in capsys.readouterr().out
    out_json = tmp_path / "rows.json"
    assert main(["verify", str(VOGN), str(bad), "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert "FIRST DIVERGENCE: step 1, g_k (vogn.5)" in out and "at index (1, 3)" in out
    doc = json.loads(out_json.read_text())
    assert doc["ok"] is False and doc["rows"][0]["name"] == "N_eff"
    assert main(["verify", str(tmp_path / "nope.npz"), str(good)]) == 2
    assert "refbayes: error: trace: no file" in capsys.readouterr().err
    assert main(["verify", str(good), str(good)]) == 2
    assert "not a golden trace" in capsys.readouterr().err


def test_cli_trace_save_then_verify_round_trip(tmp_path, capsys):
    path = tmp_path / "ogn.npz"
    assert main(["trace", "ogn", "--steps", "3", "--save", str(path)]) == 0
    out = capsys.readouterr().out
    assert "refbayes trace ogn: 3 step(s), float64" in out and f"saved: {path}" in out
    trace = tracing.load(path)
    assert trace.options["steps"] == 3 and (tmp_path / "ogn.npz.json").is_file()
    assert main(["verify", str(path), str(path)]) == 0  # a trace verifies against itself
    capsys.readouterr()
    np.savez(tmp_path / "mine.npz", **trace.outputs)
    assert main(["verify", str(path), str(tmp_path / "mine.npz")]) == 0


@pytest.mark.parametrize("argv, message", [
    (["trace", "vogn", "--save", "x.npy"], "--save: expected a file name ending in .npz"),
    (["trace", "laplace", "--dtype", "float32"], "dtype: laplace is traced in float64 only"),
    (["trace", "laplace", "--steps", "2"], "--steps: laplace is traced as one fit"),
    (["trace", "vogn", "--L", "2"], "--L: applies to"),
])
def test_cli_trace_refuses_bad_golden_options(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_trace_prints_float32_and_chained_traces_of_the_printed_methods(capsys):
    assert main(["trace", "slang", "--steps", "2", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "refbayes trace slang: 2 step(s), float32" in out
    assert out.count("[(slang.2)] U (6, 2)") == 2


def test_a_vanishing_quantity_is_compared_by_its_absolute_error():
    """The RLA trace's g = grad L(theta_map) is zero up to the MAP's stopping rule (MAP_GTOL):
    rounding-level noise, which another BLAS thread count changes completely."""
    trace = tracing.load(GOLDEN / "riemannian-laplace.npz")
    assert trace.manifest["absolute"] == {"g": MAP_GTOL}
    g = trace.outputs["g"]
    assert np.max(np.abs(g)) < MAP_GTOL
    near = {"g": g + 0.5 * MAP_GTOL}  # relative to g's own scale: an error of orders of magnitude
    row = verify.compare(trace, near).rows[0]
    assert row.ok and row.tol == MAP_GTOL and row.max_rel > 1.0
    far = {"g": g + 2 * MAP_GTOL}
    assert verify.compare(trace, far).first_failure.name == "g"


# ----------------------------------------------------------------------------- issue 35: the workflow

def _damaged_files(folder):
    """A truncated npz, one with a flipped byte (bad CRC), an empty file and a text file."""
    data = VOGN.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF
    files = {"truncated": data[: len(data) // 2], "crc": bytes(flipped), "empty": b"",
             "text": b"hello\n"}
    for name, content in files.items():
        (folder / f"{name}.npz").write_bytes(content)
    return [folder / f"{name}.npz" for name in files]


def test_a_damaged_trace_or_dump_is_a_clear_error_naming_the_argument(tmp_path, capsys,
                                                                       vogn_trace):
    good = tmp_path / "good.npz"
    np.savez(good, **_dump(vogn_trace, ["mu"]))
    for path in _damaged_files(tmp_path):
        with pytest.raises(ValueError, match=f"trace: {path} is not a readable npz file"):
            verify.compare(path, good)
        with pytest.raises(ValueError, match=f"yours: {path} is not a readable npz file"):
            verify.compare(VOGN, path)
        assert main(["verify", str(path), str(good)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"refbayes: error: trace: {path} is not a readable npz file")
        assert "Traceback" not in err and "pickled" not in err
        assert main(["verify", str(VOGN), str(path)]) == 2
        assert capsys.readouterr().err.startswith(
            f"refbayes: error: yours: {path} is not a readable npz file")


def test_cli_verify_json_that_cannot_be_written_names_json_and_the_path(tmp_path, capsys,
                                                                         vogn_trace):
    good = tmp_path / "good.npz"
    np.savez(good, **_dump(vogn_trace, ["mu"]))
    (tmp_path / "a_file").write_text("x")
    for target in ("/proc/nope.json", str(tmp_path / "a_file" / "rows.json")):
        assert main(["verify", str(VOGN), str(good), "--json", target]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"refbayes: error: --json: cannot write {target}: "), err
        assert ".tmp" not in err
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_trace_verifies_against_itself(capsys):
    assert main(["verify", str(VOGN), str(VOGN)]) == 0
    out = capsys.readouterr().out
    assert "OK: every compared quantity agrees" in out and MANIFEST_KEY not in out
    with np.load(VOGN, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    report = verify.compare(VOGN, arrays)
    assert report.ok and report.ignored == [] and report.not_dumped == []
    assert MANIFEST_KEY not in verify.load_dump(VOGN)


def test_an_rtol_of_one_or_more_is_refused_and_a_smaller_one_is_reported(vogn_trace):
    planted = _dump(vogn_trace, ["mu"])
    planted["mu"] = np.zeros_like(planted["mu"])  # everything wrong: max|0 - b| / max|b| = 1
    for rtol in (1.0, 1e9):
        with pytest.raises(ValueError, match="rtol: expected a positive finite number below 1, "
                                             f"got {rtol!r}: .*a dump of zeros"):
            verify.compare(vogn_trace, planted, rtol=rtol)
    report = verify.compare(vogn_trace, _dump(vogn_trace, ["mu", "h_hat"]), rtol=1e-3)
    assert report.ok and all(r.tol == 1e-3 for r in report.rows)
    rule = [verify.tolerance(np.float64, vogn_trace.condition[n]) for n in ("mu", "h_hat")]
    note = next(n for n in report.notes if n.startswith("rtol"))
    assert f"rtol 1.00e-03 replaced the tolerance rule's {min(rule):.2e} to {max(rule):.2e}" in note
    assert f"up to {1e-3 / min(rule):.1e} times looser" in note
    assert "note: rtol 1.00e-03 replaced" in str(report)
    tight = verify.compare(vogn_trace, _dump(vogn_trace, ["mu"]), rtol=1e-12)
    assert any("times tighter" in n for n in tight.notes)
    assert not any(n.startswith("rtol") for n in verify.compare(vogn_trace, planted).notes)


def test_a_permuted_quantity_is_named_a_layout_mistake_on_the_input_side(vogn_trace):
    """Inputs fed in refbayes order to a torch model: its sigma (vogn.4), elementwise in the state's
    s, holds the trace's values at the torch positions: yours = trace read in torch order."""
    model = tracing.model_from_spec(vogn_trace.model)
    sigma = vogn_trace.outputs["sigma"]
    for lay in ("torch", "flax"):
        read_in = layout.to_refbayes(sigma, model, lay, axes=(1,))
        for dump, given in (({"sigma": read_in}, "refbayes"),   # converted to refbayes order
                            ({"sigma": layout.from_refbayes(read_in, model, lay, axes=(1,))},
                             lay)):                            # in the layout, --layout given
            report = verify.compare(vogn_trace, dump, layout=given)
            bad = report.first_failure
            assert bad.name == "sigma" and bad.status == "diverges"
            assert f"values match the trace in {lay} order: a layout mistake, on the input side " \
                   "if the inputs were fed in refbayes order" in bad.detail, bad.detail
            text = str(report)
            assert "check that equation first" not in text
            assert "a layout mistake, not that equation" in text
    # the output side keeps its own hint
    dump = {"sigma": layout.from_refbayes(sigma, model, "torch", axes=(1,))}
    bad = verify.compare(vogn_trace, dump).first_failure
    assert "matches in the 'torch' layout: rerun with --layout torch" in bad.detail
    # a wrong value is no layout mistake
    wrong = {"sigma": sigma * 1.01}
    assert "layout" not in verify.compare(vogn_trace, wrong).first_failure.detail


def test_layout_torch_converts_each_d_block_of_bbb_mu_rho_quantities():
    trace = tracing.load(GOLDEN / "bbb.npz")
    model = tracing.model_from_spec(trace.model)
    D = model.D

    def blocks(a):  # each D-block of the last axis into torch order
        return np.concatenate([layout.from_refbayes(a[..., :D], model, "torch"),
                               layout.from_refbayes(a[..., D:], model, "torch")], axis=-1)

    names = ["delta", "state.adam.m", "state.adam.v", "input.state.adam.m"]
    ref = {**trace.inputs, **trace.outputs}
    dump = {n: blocks(ref[n]) for n in names}
    report = verify.compare(trace, dump, layout="torch")
    assert report.ok, str(report)
    assert not any("refbayes order" in n for n in report.notes)
    # without --layout the block-wise torch order is hinted
    bad = verify.compare(trace, dump).first_failure
    assert bad.name == "delta" and "rerun with --layout torch" in bad.detail  # adam.m starts at 0
    # the worst index is reported where the dump holds it (rho block: D + torch position 14)
    moved = {"delta": dump["delta"].copy()}
    moved["delta"][0, D + 14] += 1.0
    bad = verify.compare(trace, moved, layout="torch").first_failure
    assert bad.worst == (D + 14,) and bad.yours == pytest.approx(moved["delta"][0, D + 14])


def test_layout_torch_says_that_ktied_rho_quantities_are_compared_in_refbayes_order():
    trace = tracing.load(GOLDEN / "ktied.npz")
    dump = {n: trace.outputs[n] for n in ("mu", "delta", "state.adam.m", "rho")}
    model = tracing.model_from_spec(trace.model)
    dump["mu"] = layout.from_refbayes(dump["mu"], model, "torch", axes=(1,))
    report = verify.compare(trace, dump, layout="torch")
    assert report.ok, str(report)
    note = next(n for n in report.notes if "refbayes order" in n)
    assert "delta, state.adam.m, rho" in note and "not recorded" in note
    assert not any("refbayes order" in n for n in
                   verify.compare(trace, {"mu": trace.outputs["mu"]}).notes)


@pytest.fixture(scope="module")
def mc_trace():
    return tracing.build("noisy-kfac", curvature="mc")


def test_computed_inputs_are_compared_in_the_method_order_like_outputs(mc_trace):
    """noisy-kfac with curvature mc: the user computes input.probs from their draws w and
    input.y_tilde from probs and u; they are compared after w, under (noisy_kfac.3)."""
    names = ["input.u", "pi", "w", "input.probs", "input.y_tilde", "V"]
    ref = {**mc_trace.inputs, **mc_trace.outputs}
    dump = {n: ref[n].copy() for n in names}
    report = verify.compare(mc_trace, dump)
    assert report.ok
    # two steps (the default): the fed input u at both steps, then each step in the method order
    assert [(r.name, r.step) for r in report.rows] == [("input.u", 1), ("input.u", 2)] + [
        (n, k) for k in (1, 2) for n in names[1:]]
    dump["input.probs"][0, 0, 3] = dump["input.probs"][0, 0, 3, ::-1]  # a wrong predictive
    dump["V"][0, 0] += 1.0
    report = verify.compare(mc_trace, dump)
    bad = report.first_failure
    assert (bad.name, bad.tag, bad.derivation) == \
        ("input.probs", "(noisy_kfac.3)", "derivations/noisy_kfac.md")
    assert "FIRST DIVERGENCE: step 1, input.probs (noisy_kfac.3)" in str(report)
    # a wrong w comes first: probs computed from it are no news
    dump["w"][0, 0, 0] += 1.0
    assert verify.compare(mc_trace, dump).first_failure.name == "w"


def test_a_dump_with_a_former_name_is_compared_under_the_new_one_with_a_note():
    """NoisyAdamConfig.eta was renamed prior_precision (issue 38): a dump that still writes
    input.cfg.eta is compared as input.cfg.prior_precision for one release, and says so; a wrong
    value under the old name still fails."""
    trace = tracing.load(GOLDEN / "noisy-adam.npz")
    value = trace.inputs["input.cfg.prior_precision"]
    report = verify.compare(trace, {"input.cfg.eta": value, "mu": trace.outputs["mu"]})
    assert report.ok and report.ignored == []
    assert any(r.name == "input.cfg.prior_precision" for r in report.rows)
    assert any("input.cfg.eta is the former name of input.cfg.prior_precision" in n
               for n in report.notes)
    bad = verify.compare(trace, {"input.cfg.eta": value * 2, "mu": trace.outputs["mu"]})
    assert not bad.ok and bad.first_failure.name == "input.cfg.prior_precision"
    both = verify.compare(trace, {"input.cfg.eta": value * 2,
                                  "input.cfg.prior_precision": value})
    assert both.ok and both.ignored == ["input.cfg.eta"]  # the new name wins; the old is extra
