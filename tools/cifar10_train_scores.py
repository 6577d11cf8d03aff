"""Which "train accuracy" is Osawa et al.'s Table 1 column? Scores the saved final states of
``refbayes reproduce cifar10-lenet`` on the 50,000 TRAINING images, measured three ways, beside
the running accuracy the runner records and the paper's figure.

    REFBAYES_DATA=/work/shared/data python tools/cifar10_train_scores.py --out /work/runs/cifar10 \
        [--rows adam,vogn,mc-dropout-official] [--seed 0] [--draws 10]

The runner's train column (the official ``train`` loop's) is the running accuracy of the
last epoch: each minibatch's predictions at that step's own draws (VOGN: the 6 training draws;
MC dropout: the step's masks) before its update. A paper may instead report a pass over the
training set after training. This tool computes, from ``<out>/states/<row>_seed_<s>.npz``:

- ``predictive``: the row's own predictive on the training set (``make_method``'s predict, the
  one behind the validation columns: VOGN's BMA over --draws draws of q, MC dropout's over
  --draws mask sets), accuracy and NLL;
- ``point``: one pass at the mean (VOGN's and BBB's mu, MC dropout's theta without masks, Adam's
  theta).

Draws come from ``default_rng(SeedSequence([seed, row id, 7]))``, a stream the runner never
uses. One BLAS thread is pinned before NumPy loads. A few minutes per Bayesian row on one core.
"""
import os

if __name__ == "__main__":  # before NumPy loads its BLAS
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refbayes.experiments import _runner  # noqa: E402
from refbayes.experiments import cifar10_lenet as c10  # noqa: E402
from refbayes.models.conv import lenet5  # noqa: E402

STREAM = 7  # job_rng(seed, row id, 7): not one of the runner's streams (0-3)
# Table 1's rows (and the official-sites MC dropout): the state field holding the mean
MEAN_FIELD = {"adam": "theta", "vogn": "mu", "bbb": "mu", "mc-dropout": "theta",
              "mc-dropout-official": "theta"}


def _scores(P, y) -> tuple:
    return (float(np.mean(np.argmax(P, axis=1) == y)),
            float(-np.mean(np.log(P[np.arange(len(y)), y]))))


def score_row(out: Path, name: str, seed: int, draws: int, data_dir) -> dict:
    """The running (saved), predictive and point train scores of one saved job."""
    if name not in MEAN_FIELD:
        raise ValueError(f"--rows: expected rows of {sorted(MEAN_FIELD)} (Table 1's), got {name!r}")
    state_path = c10._state_path(out, name, seed)
    if not state_path.exists():
        raise FileNotFoundError(f"--out: no final state {state_path}; run the {name} job first")
    with np.load(state_path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        arrays = {k: z[k] for k in z.files if k != "meta"}
    settings = meta["settings"]
    data = c10._load(data_dir, settings["dtype"], c10.ROWS[name].normalized, settings["n_train"],
                     settings["n_test"])
    net = lenet5()
    theta0 = arrays[f"state.{MEAN_FIELD[name]}"]  # only the template's
    m = c10.make_method(name, net, theta0, data.X.shape[0])
    state = c10._unpack(m.state, "state.", arrays)
    rng = _runner.job_rng(seed, c10.ROWS[name].rid, STREAM)
    S = draws if c10.ROWS[name].bayes else 1
    result = json.loads(c10._path(out, name, seed).read_text())["final"]
    row = {"row": name, "seed": seed, "running_acc": result["train_acc"],
           "running_nll": result["train_nll"], "val_acc": result["acc"],
           "paper_train_acc": c10.PAPER.get(name, (None,))[0]}
    row["predictive_acc"], row["predictive_nll"] = _scores(m.predict(state, data.X, rng, S),
                                                           data.y)
    point = c10._bma(net, getattr(state, MEAN_FIELD[name])[:, None], data.X)
    row["point_acc"], row["point_nll"] = _scores(point, data.y)
    row["draws"] = S
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="the runner's --out")
    p.add_argument("--rows", default="adam,vogn,mc-dropout-official")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=10)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if args.draws < 1:
        p.error(f"--draws: expected an integer >= 1, got {args.draws}")
    data_dir = _runner.worker_path(args.data_dir)
    print("row | running train acc / NLL | predictive on train | point on train | val acc | "
          "paper train acc")
    for name in args.rows.split(","):
        if name not in MEAN_FIELD:
            p.error(f"--rows: expected rows of {sorted(MEAN_FIELD)} (Table 1's), got {name!r}")
        r = score_row(args.out, name, args.seed, args.draws, data_dir)
        print(f"{name} | {100 * r['running_acc']:.2f} / {r['running_nll']:.3f} | "
              f"{100 * r['predictive_acc']:.2f} / {r['predictive_nll']:.3f} ({r['draws']} draws) | "
              f"{100 * r['point_acc']:.2f} / {r['point_nll']:.3f} | {100 * r['val_acc']:.2f} | "
              f"{r['paper_train_acc']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
