"""The first epoch of cifar10-lenet's ``noisy-kfac`` row with torchsso's three step options
switched one at a time (derivations/cifar10_lenet.md, "Noisy K-FAC: why the first runs
diverged").

Each variant is (weight_decay, sampler_damping, refresh_order); the rest is the row's: the seed's
start, its minibatch order and draws (the runner's streams), float32, lenet_noisykfac.json's
values. Every ``--every`` steps a CSV row is written as it comes (variant, step, max|mu|,
||mu||_2, the largest eigenvalue of the running input factors A, the running accuracy of the
last ``--every`` steps at the step's draws); a variant whose damped factor cannot be factorised
stops there with a row saying at which step. Usage::

    python tools/noisy_kfac_epoch1_ablation.py --out ablation.csv
    python tools/noisy_kfac_epoch1_ablation.py --variants "0.1,full,before" --steps 200 --out a.csv

Without --variants it runs the six of the note's table (about 6 minutes each on one core).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from refbayes.experiments import cifar10_lenet as c10
from refbayes.experiments._runner import job_rng
from refbayes.methods import driver
from refbayes.methods._estimates import Batch

__all__ = ["COLUMNS", "VARIANTS", "main", "parse_variants", "run_variant"]

VARIANTS = ((0.0, "intrinsic", "after"), (0.1, "intrinsic", "after"), (0.0, "full", "after"),
            (0.1, "full", "after"), (0.0, "full", "before"), (0.1, "full", "before"))
COLUMNS = ("weight_decay", "sampler_damping", "refresh_order", "step", "mu_max", "mu_norm",
           "max_eig_A", "running_acc", "failed")


def parse_variants(text: str) -> tuple:
    """"wd,sampler,order;..." -> ((wd, sampler, order), ...)."""
    out = []
    for part in text.split(";"):
        fields = [f.strip() for f in part.split(",")]
        if len(fields) != 3:
            raise ValueError(f"--variants: expected 'weight_decay,sampler_damping,refresh_order' "
                             f"items separated by ';', got {part!r}")
        out.append((float(fields[0]), fields[1], fields[2]))
    return tuple(out)


def run_variant(variant, data, seed: int, steps: int, every: int):
    """Yield one CSV row (dict of COLUMNS) every ``every`` steps, and a last one if the step
    fails on a damped factor (ValueError from the Cholesky factorisation)."""
    wd, sampler, order = variant
    net, row = c10.lenet5(), c10.ROWS["noisy-kfac"]
    N = data.X.shape[0]
    theta0 = net.init_theta(job_rng(seed, 0), dtype=np.dtype(data.X.dtype), scheme="pytorch")
    m = c10.make_method("noisy-kfac", net, theta0, N, init_rng=job_rng(seed, row.rid, 3),
                        noisy_kfac_options={"weight_decay": wd, "sampler_damping": sampler,
                                            "refresh_order": order})
    rng = job_rng(seed, row.rid, 0)  # the runner's streams: draws, then epoch 0's minibatches
    batches = driver.epoch_batches(job_rng(seed, row.rid, 1, 0), N, m.M)
    state, hit, seen = m.state, 0, 0
    key = {"weight_decay": wd, "sampler_damping": sampler, "refresh_order": order}
    for j in range(min(steps, len(batches))):
        rows = batches[j]
        batch = Batch(data.X[rows], data.y[rows])
        try:
            new, info = m.step(state, batch, rng, j, 0)
        except ValueError as err:
            yield {**key, "step": j + 1, "failed": str(err).split(":")[0]}
            return
        P = m.train_probs(state, info, batch.X)
        hit += int(np.sum(np.argmax(P, axis=1) == data.y[rows]))
        seen += len(rows)
        state = new
        if (j + 1) % every == 0:
            mu = state.mu.astype(np.float64)
            eig = max(float(np.linalg.eigvalsh(A.astype(np.float64))[-1]) for A in state.A)
            yield {**key, "step": j + 1, "mu_max": float(np.abs(mu).max()),
                   "mu_norm": float(np.linalg.norm(mu)), "max_eig_A": eig,
                   "running_acc": hit / seen, "failed": ""}
            hit = seen = 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="the CSV to write")
    p.add_argument("--variants", default=None,
                   help="'weight_decay,sampler_damping,refresh_order;...' (default: the six)")
    p.add_argument("--steps", type=int, default=782, help="steps of epoch 1 (at most 782)")
    p.add_argument("--every", type=int, default=25, help="steps per CSV row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train", type=int, default=c10.N_TRAIN)
    p.add_argument("--data-dir", default=None)
    a = p.parse_args(argv)
    if a.steps < 1 or a.every < 1:
        raise ValueError(f"--steps and --every: expected integers >= 1, got {a.steps}, {a.every}")
    variants = VARIANTS if a.variants is None else parse_variants(a.variants)
    data = c10._load(a.data_dir, "float32", False, a.n_train, 1)  # None: REFBAYES_DATA
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for v in variants:
            t0 = time.perf_counter()
            for r in run_variant(v, data, a.seed, a.steps, a.every):
                w.writerow(r)
                f.flush()  # results as they come
                print(f"{v}: step {r['step']}"
                      + (f" FAILED ({r['failed']})" if r["failed"] else
                         f", ||mu|| {r['mu_norm']:.3g}, running acc {r['running_acc']:.3f}")
                      + f", {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
