"""refbayes.experiments._report: the convergence criterion on training curves and the caveat a
reduced-budget run prints beside a paper's figures (issue 35, item 6)."""
import math

import numpy as np

from refbayes.experiments import _report


def test_a_levelled_curve_converges_and_a_falling_one_does_not():
    steps = np.arange(0, 1001, 50)
    levelled = [(int(t), 0.5 + 100.0 * math.exp(-t / 50.0)) for t in steps]  # flat after ~600
    rec = _report.plateau(levelled, 1000, "-ELBO / N", 0.01)
    assert rec["converged"] is True and (rec["start"], rec["end"]) == (900, 1000)
    assert rec["relative_change"] < 1e-3 and "last 10% of 1000 steps" in rec["criterion"]
    assert _report.not_converged(rec, "run") == ""
    # the same objective stopped early (a deliberately short run): still falling
    short = [(t, v) for t, v in levelled if t <= 200]
    rec = _report.plateau(short, 200, "-ELBO / N", 0.01)
    assert rec["converged"] is False and (rec["start"], rec["end"]) == (150, 200)
    line = _report.not_converged(rec, "run")
    assert line.startswith("not converged: run: -ELBO / N went") and "from 150 to 200" in line
    assert _report.legend("run", rec) == "run (not converged)"


def test_the_window_is_the_last_point_before_90_percent_and_atol_covers_a_kl_near_zero():
    # log-spaced points: none at 90%, so the window starts earlier (a stricter test)
    rec = _report.plateau([(1, 5.0), (50, 1.0), (80, 1.0), (100, 1.0)], 100, "KL", 0.01)
    assert rec["converged"] is True and rec["start"] == 80
    rec = _report.plateau([(1, 5.0), (50, 2.0), (100, 1.0)], 100, "KL", 0.01)
    assert rec["converged"] is False and rec["start"] == 50
    # a KL at its noise floor: 2e-3 -> 1e-3 is 100% relative, within 0.01 absolute
    floor = [(1, 5.0), (90, 2e-3), (100, 1e-3)]
    assert _report.plateau(floor, 100, "KL", 0.01)["converged"] is False
    assert _report.plateau(floor, 100, "KL", 0.01, atol=0.01)["converged"] is True


def test_a_curve_that_cannot_be_judged_is_not_assessed():
    assert _report.plateau([], 100, "KL", 0.01)["converged"] is None
    assert _report.plateau([(0, 1.0), (50, 0.5)], 100, "KL", 0.01)["converged"] is None  # cut short
    assert _report.plateau([(100, 1.0)], 100, "KL", 0.01)["converged"] is None  # no window start
    assert _report.plateau([(0, math.nan), (100, 1.0)], 100, "KL", 0.01)["converged"] is None
    assert _report.not_converged(None) == "" and _report.legend("x", None) == "x"


def test_the_caveat_names_the_run_and_what_was_reduced():
    assert _report.caveat("S = 1, 600 steps", "the paper's figures", []) == ""
    line = _report.caveat("S = 1, 600 steps", "the paper's figures",
                          ["600 of 10000 steps", "the 5k subset"], "quick")
    assert line == ("CAVEAT - quick run: S = 1, 600 steps; not comparable to the paper's figures "
                    "(600 of 10000 steps; the 5k subset)")
    assert _report.caveat("x", "y", ["z"]).startswith("CAVEAT - reduced-budget run: x;")
