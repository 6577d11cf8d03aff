"""Self-check of the installed library against its dense oracles, on data shipped in the package.

On a seeded synthetic logistic-regression problem it checks, and times:
  * per-example gradients: numba vs vectorized vs the autograd loop (logistic regression and a
    one-hidden-layer tanh MLP), and that their rows sum to the full gradient;
  * curvature: the closed-form logistic GGN equals autograd's Hessian, diag_ggn equals diag(ggn),
    diag_ef equals diag(G^T G);
  * low-rank-plus-diagonal algebra on the GGN's rank-L factor: solve, sample (as a linear map),
    logdet and diag of the inverse against the explicit D x D inverse;
  * KL between the rank-L and rank-(L + 3) Gaussians by the O(D L^2) identities vs the dense formula.
Each check has a float64 tolerance from ``refbayes._tolerances``; the command exits 1 when one fails.
Results go to ``<out>/selfcheck.json`` as they are produced (with their provenance: the sha256 of
the generated data, the refbayes version and the git commit), a figure to ``<out>/selfcheck.png``.

The four groups of checks are independent jobs (``--jobs N`` local processes or
``--dask-scheduler ADDRESS``, ``refbayes.experiments._runner``): each rebuilds the seeded
problem, so the errors equal the serial run's bit for bit; the timings are then taken while
the other groups run (use the serial run to time).
"""
from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import numpy as np

from refbayes._files import format_table, write_json
from refbayes._tolerances import EXACT_F64, rel_err
from refbayes.datasets import make_logistic_regression
from refbayes.experiments import _runner
from refbayes.experiments._runner import (
    provenance,
    pyplot,
    save_figure,
    seed_arg,
    sha256_arrays,
)
from refbayes.linalg import gaussian, lowrank
from refbayes.models import MLP, LogisticRegression, add_intercept

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = "check per-example gradients, curvature and low-rank algebra against dense oracles"


def _out_dir(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder, got the file {text!r}")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _runner.add_output_arguments(parser, "selfcheck", None, out_type=_out_dir)
    parser.add_argument("--seed", type=seed_arg, default=0, help="seed of the synthetic data (default 0)")
    parser.add_argument("--quick", action="store_true", help="smaller problem (smoke test)")
    _runner.add_arguments(parser)


def _best_time(fn, repeat=5) -> float:
    """The best of ``repeat`` wall-clock timings, in seconds (the least disturbed run)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _gradient_checks(name, model, theta, X, y):
    G = {impl: model.per_example_grads(theta, X, y, impl=impl)
         for impl in ("autograd", "vectorized", "numba")}
    seconds = {impl: _best_time(lambda i=impl: model.per_example_grads(theta, X, y, impl=i),
                                repeat=1 if impl == "autograd" else 5) for impl in G}
    rows = [(f"{name}: numba vs autograd per-example grads", rel_err(G["numba"], G["autograd"])),
            (f"{name}: vectorized vs autograd per-example grads", rel_err(G["vectorized"], G["autograd"])),
            (f"{name}: sum of per-example grads vs grad", rel_err(G["numba"].sum(0), model.grad(theta, X, y))),
            (f"{name}: diag_ef vs diag(G^T G)", rel_err(model.diag_ef(theta, X, y),
                                                      np.einsum("md,md->d", G["autograd"], G["autograd"])))]
    return rows, {f"{name}: per_example_grads impl={k}": v for k, v in seconds.items()}


def _curvature_checks(model, theta, X, y):
    """The closed-form logistic GGN against autograd's Hessian of the same loss (equal: f is linear)."""
    ggn = model.ggn(theta, X, y)
    as_mlp = MLP(list(model.sizes), likelihood="bernoulli")  # same theta layout, autograd Hessian
    return [("logistic: closed-form GGN vs autograd Hessian", rel_err(ggn, as_mlp.hessian(theta, X, y))),
            ("logistic: diag_ggn vs diag(GGN)", rel_err(model.diag_ggn(theta, X, y), np.diag(ggn)))]


def _truncated_precision(F, lam, L):
    """(U, d): U the rank-L truncation of F F^T, d = lam + diag(F F^T - U U^T) (SLANG's form)."""
    U = lowrank.top_eig(F, L)
    return U, lam + np.einsum("dk,dk->d", F, F) - np.einsum("dl,dl->d", U, U)


def _dense_kl(mu_q, P_q, mu_p, P_p):
    """The textbook KL(q || p) with explicit inverses: the naive oracle for (gaussian.3)."""
    Sigma_q = np.linalg.inv(P_q)
    m = mu_q - mu_p
    return 0.5 * (np.trace(P_p @ Sigma_q) + m @ P_p @ m - len(m)
                  - np.linalg.slogdet(P_p)[1] + np.linalg.slogdet(P_q)[1])


def _lowrank_checks(F, lam, L):
    """Rank-L precision of lam I + F F^T against its explicit D x D inverse, and the KL between
    the rank-L and rank-(L + 3) forms by the O(D L^2) identities against the dense formula."""
    D = F.shape[0]
    U, d = _truncated_precision(F, lam, L)
    P = U @ U.T + np.diag(d)
    Sigma = np.linalg.inv(P)
    g = np.linspace(-1.0, 1.0, D)
    S = lowrank.sample(np.zeros(D), U, d, np.eye(D))
    U2, d2 = _truncated_precision(F, lam, L + 3)
    mu2 = 0.1 * g
    kl = float(gaussian.kl(gaussian.LowRankPrec(np.zeros(D), U, d), gaussian.LowRankPrec(mu2, U2, d2)))
    kl_ref = _dense_kl(np.zeros(D), P, mu2, U2 @ U2.T + np.diag(d2))
    return [(f"rank-{L}: solve vs dense inverse", rel_err(lowrank.solve(U, d, g), Sigma @ g)),
            (f"rank-{L}: sample S S^T vs dense inverse", rel_err(S @ S.T, Sigma)),
            (f"rank-{L}: logdet vs slogdet", rel_err(lowrank.logdet(U, d), np.linalg.slogdet(P)[1])),
            (f"rank-{L}: diag_inv vs diag(dense inverse)", rel_err(lowrank.diag_inv(U, d), np.diag(Sigma))),
            (f"KL(rank-{L} || rank-{L + 3}) vs dense formula", rel_err(kl, kl_ref))]


def _problem_text(n, p, width, L, seed, quick) -> str:
    """The problem the checks ran on, in words: what the table and the figure title state (no
    Monte Carlo samples and no training: every check is one deterministic evaluation)."""
    return (f"{'--quick' if quick else 'full'} problem: n = {n} rows, p = {p} features, MLP "
            f"width {width}, rank L = {L}, seed {seed}; deterministic (no sampling, no training)")


def _figure(rows, out: Path, title: str = ""):
    plt = pyplot()
    if plt is None:
        return None
    names = [r["check"] for r in rows]
    errs = [max(r["error"], 1e-18) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    ax.barh(range(len(rows)), errs, color=["tab:green" if r["ok"] else "tab:red" for r in rows])
    for k, r in enumerate(rows):
        if r["error"] == 0.0:
            ax.text(2e-18, k, "exactly 0", va="center", fontsize=7)
    ax.axvline(EXACT_F64, color="k", ls="--", label=f"tolerance {EXACT_F64:g}")
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("relative error vs dense oracle (float64)")
    ax.legend(loc="lower right")
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path = out / "selfcheck.png"
    save_figure(fig, path, dpi=120)
    return path


def _logistic_ggn_factor(model, theta, X):
    """F (D, n) with F F^T = X_aug^T diag(s (1 - s)) X_aug, the logistic GGN, s = sigmoid(logits)."""
    s = 1.0 / (1.0 + np.exp(-model.forward(theta, X)[:, 0]))
    return (add_intercept(X) * np.sqrt(s * (1.0 - s))[:, None]).T


CHECKS = ("per-example gradients, logistic", "per-example gradients, MLP", "curvature",
          "low-rank algebra")


def _problem(quick: bool, seed: int):
    """The seeded synthetic problem: data, the two models and their parameters."""
    n, p, width, L = (200, 10, 20, 3) if quick else (1000, 30, 50, 5)
    data = make_logistic_regression(n, p, seed)
    rng = np.random.default_rng(seed)
    logreg = LogisticRegression(p, intercept=True)
    mlp = MLP([p, width, 1], activation="tanh", likelihood="bernoulli")
    theta_lr = 0.5 * rng.standard_normal(logreg.D)
    theta_mlp = mlp.init_theta(rng)
    return types.SimpleNamespace(n=n, p=p, width=width, L=L, X=data.X, y=data.y, logreg=logreg,
                                 mlp=mlp, theta_lr=theta_lr, theta_mlp=theta_mlp)


def _check(label: str, pb):
    """(rows [(check, error)], timings {name: seconds}) of the group of checks ``label``."""
    X, y = pb.X, pb.y
    if label == CHECKS[0]:
        return _gradient_checks("logistic", pb.logreg, pb.theta_lr, X, y)
    if label == CHECKS[1]:
        return _gradient_checks(f"mlp[{pb.p},{pb.width},1]", pb.mlp, pb.theta_mlp, X, y)
    if label == CHECKS[2]:
        return _curvature_checks(pb.logreg, pb.theta_lr, X, y), {}
    return _lowrank_checks(_logistic_ggn_factor(pb.logreg, pb.theta_lr, X), 1.0, pb.L), {}


def _check_job(label: str, quick: bool, seed: int):
    """One group of checks, as a job of ``_runner.execute`` (the problem rebuilt here)."""
    return _check(label, _problem(quick, seed))


def _rows(new):
    return [{"check": c, "error": e, "tolerance": EXACT_F64, "ok": bool(e <= EXACT_F64)}
            for c, e in new]


def run(args: argparse.Namespace) -> int:
    """The ``refbayes reproduce selfcheck`` handler: every group of checks is a job (nothing is
    resumed: the checks take seconds); selfcheck.json holds the finished groups, in CHECKS
    order, after each one."""
    out = Path(args.out)
    _, progress = _runner.start(out, True, len(CHECKS), 0, "selfcheck",  # before any check runs
                                resumable=False)
    pb = _problem(args.quick, args.seed)
    n, p, width, L = pb.n, pb.p, pb.width, pb.L
    prov = provenance({"synthetic": sha256_arrays(pb.X, pb.y)})
    rows, timings, finished = [], {}, {}

    def done(label, result):
        finished[label] = result
        rows.clear()
        timings.clear()
        for c in CHECKS:
            if c in finished:
                rows.extend(_rows(finished[c][0]))
                timings.update(finished[c][1])
        write_json(out / "selfcheck.json", {"problem": {"n": n, "p": p, "width": width, "L": L,
                                                         "seed": args.seed},
                                             "checks": rows, "timings_s": timings,
                                             "provenance": prov,
                                             # false until every group is in (an interrupted run)
                                             "complete": len(finished) == len(CHECKS)})
        progress.advance(label)

    jobs = [_runner.Job(c, _check_job, (c, bool(args.quick), args.seed)) for c in CHECKS]
    with progress:
        _runner.execute([_runner.Section(jobs)], done, progress, **_runner.job_options(args))
    problem = _problem_text(n, p, width, L, args.seed, args.quick)
    print(f"selfcheck: {problem}")
    print(format_table(["check", "relative error", "tolerance", "ok"],
                       [[r["check"], f"{r['error']:.2e}", f"{r['tolerance']:.0e}", "yes" if r["ok"] else "NO"]
                        for r in rows]))
    print()
    print(format_table(["timing (n = %d)" % n, "best of runs (ms)"],
                       [[k, f"{1e3 * v:.3f}"] for k, v in timings.items()]))
    fig = _figure(rows, out, problem)
    print(f"\nresults: {out / 'selfcheck.json'}" + (f", figure: {fig}" if fig else ""))
    failed = [r["check"] for r in rows if not r["ok"]]
    if failed:
        print(f"FAILED: {len(failed)} check(s): " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0
