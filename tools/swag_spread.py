"""How wide is the calibration benchmark's SWAG Gaussian? Refits one job's SGD-SWA run, as the job
ran it, and prints the spread of the SWAG posterior and what it changes in the predictive.

    python tools/swag_spread.py [--dataset mnist] [--seed 0] [--epochs 20] [--quick]

The fit uses the benchmark's own pieces (``refbayes.experiments.calibration``: data, split,
network, prior, method settings and the job's training generator), so the state is the one
behind the table's swa / swag-diag / swag rows. Printed: the rms of sqrt(Sigma_diag) (swag.4),
the rms |theta_SWA|, the rms of the deviation columns D_hat / sqrt(K - 1), the number of
snapshots and SGD steps between two of them, and on the test rows the mean total-variation
distance and KL(SWA || SWAG) between the SWA predictive and SWAG's (30 draws, scale 1/2): the
numbers that say whether SWAG can differ from SWA at all.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refbayes.experiments import calibration as cal  # noqa: E402
from refbayes.experiments import calibration_methods as cm  # noqa: E402
from refbayes.methods import swag  # noqa: E402
from refbayes.models import MLP  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist", choices=cal.DATASETS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)

    X, y, _ = cal.load_data(args.dataset, args.data_dir)
    train, test = cal.split(args.dataset, y, args.seed)
    td = cal.task_data(X, y, train, test, "main")
    spec = cm.METHODS["swag"]
    hyper = {**cal.method_settings(spec, args.quick, args.epochs),
             "prior_precision": td.X_train.shape[0] * cal.WEIGHT_DECAY}
    hidden = cal.BUDGETS["quick" if args.quick else "full"]["hidden"]
    model = MLP([X.shape[1], hidden, hidden, td.n_classes], "relu", "categorical")
    rng = cal._rng(args.seed, args.dataset, "main", 1, spec.train)  # the job's training stream
    post = spec.fit(model, td.X_train, td.y_train, hyper, rng, lambda k: None)
    state, K = post.state, post.K
    n = int(state.n)
    var = swag.diag_variance(state, swag.SWAGConfig(K=K))
    cols = np.asarray(state.D_hat[:min(n, K)]) / np.sqrt(max(min(n, K) - 1, 1))
    steps_per_epoch = -(-td.X_train.shape[0] // hyper["M"])
    print(f"{args.dataset} seed {args.seed}: {hyper['epochs']} epochs, swa_epochs "
          f"{hyper['swa_epochs']}, swa_lr {hyper['swa_lr']}, K {K}; {n} snapshots, "
          f"{steps_per_epoch} SGD steps between two; D = {model.D}")
    print(f"rms sqrt(Sigma_diag) {np.sqrt(np.mean(var)):.3e}; rms |theta_SWA| "
          f"{np.sqrt(np.mean(state.theta_bar ** 2)):.3e}; rms deviation column "
          f"{np.sqrt(np.mean(cols ** 2)):.3e}")
    P_swa = cm.METHODS["swa"].predict(post, model, td.X_test, np.random.default_rng(1), 1)
    P_swag = spec.predict(post, model, td.X_test, np.random.default_rng(2), args.samples)
    tv = 0.5 * np.abs(P_swa - P_swag).sum(axis=1)
    kl = np.sum(P_swa * (np.log(P_swa + 1e-300) - np.log(P_swag + 1e-300)), axis=1)
    print(f"SWA vs SWAG ({args.samples} draws) on {td.X_test.shape[0]} test rows: mean TV "
          f"{tv.mean():.3e} (max {tv.max():.3e}), mean KL {kl.mean():.3e}; top-label changes "
          f"{int(np.sum(P_swa.argmax(1) != P_swag.argmax(1)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
