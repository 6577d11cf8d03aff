"""Check Noisy K-FAC's torchsso options step for step against torchsso's ``VIOptimizer``.

dl-with-bayes' ``lenet_noisykfac.json`` runs on torchsso (cybertronai/pytorch-sso, read at
d161732), whose step differs from gd-zhang's in three ways that ``NoisyKFACConfig`` offers
(derivations/noisy_kfac.md, "torchsso"): ``weight_decay`` added after the solve
(noisy_kfac.11), the sampler damped like the solve, ``sampler_damping="full"`` (noisy_kfac.6),
and a due refresh before the solve, ``refresh_order="before"`` (noisy_kfac.12); and its
'raw' momentum, ``momentum_type="raw"`` (noisy_kfac.20), checked with ``--momentum-type raw``.

This runs torchsso's optimizer and ``noisy_kfac.step`` side by side on a 3-4-3 ReLU classifier
in float64. It prints max|refbayes - torchsso| / max|torchsso| over steps 1-6 of the draws, the
mean, the momentum buffer, the EMA factors and the two sides of the sampler's covariance. It
also prints how torchsso's draws are distributed: its sampler ``G_ic E A_ic`` uses the UPPER
Cholesky factors U of the damped inverses (U^T U = inverse), so the input side's covariance is
A_g^{-1} but the output side's is U_G U_G^T, not G_g^{-1}.

torchsso is not a dependency of refbayes; give a checkout of pytorch-sso (PyTorch comes with
the "conformance" extra)::

    git clone https://github.com/cybertronai/pytorch-sso /tmp/pytorch-sso
    python tools/torchsso_noisy_kfac_check.py --torchsso /tmp/pytorch-sso [--momentum-type raw]

Three things make torchsso import and run on a CPU with a current PyTorch, none of which touches
the arithmetic: a stand-in ``chainer`` module when chainer is missing (the distributed
communicators import it at import time; this check does not use them), ``torchsso.utils.cholesky``
computed by ``torch.linalg.cholesky`` (its CPU branch calls CuPy), and the two hook dictionaries
that ``torch.optim.Optimizer.__init__`` sets (torchsso's optimizers do not call it and
PyTorch >= 2 wraps ``step`` with those hooks).

How the two runs are lined up:
- the curvature is torchsso's "Cov" (empirical Fisher, true labels) = refbayes' "ef";
- torchsso's first step draws nothing (its std is not set yet) and replaces the start factors
  with the first statistics: refbayes' first step is ``noisy_kfac.step`` with eps=None and
  beta = 1, from torchsso's start;
- torchsso adds its prior term l2_reg mu at the MEAN, refbayes gamma_in w at the draws
  (noisy_kfac.8): the noise is antithetic (the second of S = 2 draws negates the first), so the
  draws average to the mean and the two terms agree;
- refbayes' standard-normal eps is recovered from torchsso's draws by inverting the sampling map
  (noisy_kfac.7), eps = L_A^T Z L_S (``eps_from_draws``).
Exit status 1 if a compared quantity differs by more than ``TOLERANCE``.
"""
from __future__ import annotations

import argparse
import math
import sys
import types
from collections import OrderedDict
from pathlib import Path

import numpy as np

from refbayes.conformance import torch_order
from refbayes.conventions import from_pytorch_sso_noisy_kfac
from refbayes.linalg import kron
from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch
from refbayes.models import MLP

__all__ = ["TOLERANCE", "eps_from_draws", "load_torchsso", "main"]

TOLERANCE = 1e-12
SIZES = [3, 4, 3]
N, M, S, STEPS = 30, 8, 2, 6
# torchsso's arguments, and refbayes' config by refbayes.conventions' conversion
TORCHSSO = {"dataset_size": N, "curv_type": "Cov", "curv_shapes": {"Linear": "Kron"},
            "curv_kwargs": {"damping": 0.05, "ema_decay": 0.3, "pi_type": "tracenorm"},
            "lr": 0.1, "momentum": 0.9, "momentum_type": "preconditioned", "weight_decay": 0.2,
            "num_mc_samples": S, "kl_weighting": 0.7, "prior_variance": 0.5}


def eps_from_draws(state, W, cfg, model):
    """The standard-normal eps (D, S) that ``noisy_kfac.step`` maps to the draws W (D, S) under
    factored damping: per layer Z = (W~ - M~) / sqrt(lambda / N), eps~ = L_A^T Z L_S with the
    sampler's Cholesky factors of A_ref, S_ref (the inverse of (noisy_kfac.7)); MLP layers only."""
    if cfg.damping != "factored":
        raise ValueError(f"cfg.damping: expected 'factored', got {cfg.damping!r}")
    g_in = nk.gamma_in(cfg)
    g_s = g_in if cfg.sampler_damping == "intrinsic" else g_in + cfg.gamma_ex
    Z = (W - state.mu[:, None]) / math.sqrt(cfg.kl_weight / cfg.N)
    eps = np.empty_like(Z)
    for (a, b, n_a, n_b), A, Sf in zip(nk.layer_slices(model), state.A_ref, state.S_ref):
        L_A, L_S = kron.factored_chol(A, Sf, g_s)
        Zl = Z[a:b].reshape(n_a, n_b, -1)
        eps[a:b] = np.einsum("ji,jks,kl->ils", L_A, Zl, L_S).reshape(b - a, -1)
    return eps


def load_torchsso(path):
    """Import torchsso from a pytorch-sso checkout at ``path``, made to run on a CPU (see the
    module docstring)."""
    root = Path(path)
    if not (root / "torchsso" / "__init__.py").is_file():
        raise FileNotFoundError(f"--torchsso: expected a pytorch-sso checkout holding "
                                f"torchsso/__init__.py, got {root}")
    try:
        import chainer  # noqa: F401
    except ImportError:  # only torchsso's distributed communicators use it
        chainer = types.ModuleType("chainer")
        chainer.backends = types.ModuleType("chainer.backends")
        chainer.backends.cuda = None
        sys.modules.update({"chainer": chainer, "chainer.backends": chainer.backends})
    sys.path.insert(0, str(root))
    import torch
    import torchsso
    torchsso.utils.cholesky = lambda m, upper=True: torch.linalg.cholesky(m, upper=upper)
    return torchsso


def _torchsso_run(torchsso, kw, X, y, batches):
    """torchsso's VIOptimizer for STEPS steps with antithetic noise; per step the draws, the
    mean, the momentum buffer, the EMA factors and the std factors (torch order)."""
    import torch
    import torch.nn.functional as F
    from torchsso.optim import VIOptimizer
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                              torch.nn.Linear(4, 3)).double()
    opt = VIOptimizer(net, val_num_mc_samples=0, **kw)
    opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks = OrderedDict(), OrderedDict()
    drawn, real = [], torch.randn_like

    def antithetic(t, **kwargs):  # per draw, per layer: draw s = 1 negates draw s = 0
        i = len(drawn)
        drawn.append(real(t, **kwargs) if i < len(opt.param_groups)
                     else -drawn[i - len(opt.param_groups)])
        return drawn[-1]

    def flat(ts):
        return np.concatenate([t.detach().numpy().reshape(-1) for t in ts])

    out = [{"mean": flat(net.parameters())}]  # the start
    torch.randn_like = antithetic
    try:
        for rows in batches:
            data, target = torch.from_numpy(X[rows]), torch.from_numpy(y[rows])
            draws = []

            def closure():
                opt.zero_grad()
                draws.append(flat(net.parameters()))
                f = net(data)
                loss = F.cross_entropy(f, target)
                loss.backward()
                return loss, f
            drawn.clear()
            opt.step(closure=closure)
            means = [m for g in opt.param_groups for m in g["mean"]]
            out.append({"draws": np.stack(draws, axis=1), "mean": flat(means),
                        "buf": flat(opt.state[m]["momentum_buffer"] for m in means),
                        "A": [g["curv"].ema[0].numpy().copy() for g in opt.param_groups],
                        "G": [g["curv"].ema[1].numpy().copy() for g in opt.param_groups],
                        "U": [[u.numpy().copy() for u in g["curv"].std]
                              for g in opt.param_groups]})
    finally:
        torch.randn_like = real
    return out


def _cov(L):
    """(L L^T)^{-1}: one side of the sampler's covariance from its lower Cholesky factor."""
    return np.linalg.inv(L @ L.T)


def _rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchsso", required=True, help="a pytorch-sso checkout")
    parser.add_argument("--momentum-type", choices=nk.MOMENTUM_TYPES, default="preconditioned",
                        help="torchsso's momentum_type (default 'preconditioned')")
    args = parser.parse_args(argv)
    kw = {**TORCHSSO, "momentum_type": args.momentum_type}
    cfg = from_pytorch_sso_noisy_kfac(**kw)
    torchsso = load_torchsso(args.torchsso)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((N, 3)), rng.integers(0, 3, N)
    batches = [rng.choice(N, M, replace=False) for _ in range(STEPS)]
    sso = _torchsso_run(torchsso, kw, X, y, batches)
    model = MLP(SIZES, "relu", "categorical")
    perm = torch_order(SIZES)

    def ref(v):  # torch order -> refbayes' (v[perm] is torch's)
        out = np.empty_like(v)
        out[perm] = v
        return out

    state = nk.init(ref(sso[0]["mean"]), model)
    eq = "(noisy_kfac.20)" if cfg.momentum_type == "raw" else "(noisy_kfac.11)"
    errors = {"draws (noisy_kfac.6)-(noisy_kfac.7)": [], f"mean {eq}": [],
              f"momentum buffer {eq}": [], "A (noisy_kfac.4)": [],
              "S = torchsso's G (noisy_kfac.4)": [],
              "sampler's input-side covariance (noisy_kfac.6)": [],
              "sampler's output-side covariance (noisy_kfac.6), vs U_G^T U_G": []}
    for t, (rows, rec) in enumerate(zip(batches, sso[1:])):
        W = ref(rec["draws"])
        if t == 0:  # torchsso's first step: at the mean, the start factors replaced
            state, info = nk.step(state, Batch(X[rows], y[rows]), None, cfg._replace(beta=1.0),
                                  model)
            info = info._replace(w=np.repeat(info.w, S, axis=1))  # its S passes at the mean
            state = nk.refresh(state, cfg, model)  # the sampler's operators, for the next draws
        else:
            eps = eps_from_draws(state, W, cfg, model)
            state, info = nk.step(state, Batch(X[rows], y[rows]), eps, cfg, model)
        rows_err = [_rel(info.w, W), _rel(state.mu, ref(rec["mean"])),
                    _rel(state.m, ref(rec["buf"])),
                    max(_rel(a, b) for a, b in zip(state.A, rec["A"])),
                    max(_rel(a, b) for a, b in zip(state.S, rec["G"])),
                    # the refreshed sampler (the next step's) against torchsso's std factors
                    max(_rel(_cov(op.L_A_in), U_A.T @ U_A)
                        for op, (U_A, _) in zip(state.inv.layers, rec["U"])),
                    max(_rel(_cov(op.L_S_in), U_G.T @ U_G)
                        for op, (_, U_G) in zip(state.inv.layers, rec["U"]))]
        for k, e in zip(errors, rows_err):
            errors[k].append(e)
    print(f"torchsso VIOptimizer ({args.torchsso}) against noisy_kfac.step with "
          f"from_pytorch_sso_noisy_kfac's config; {SIZES} ReLU, float64, steps 1-{STEPS} "
          f"(step 1: eps=None, beta = 1); momentum_type {cfg.momentum_type!r}")
    width = max(map(len, errors))
    for k, v in errors.items():
        print(f"{k:<{width}}  max relative error {max(v):.2e}")
    g = nk.gamma_in(cfg) + cfg.gamma_ex
    last = sso[-1]  # torchsso's std factors after its last step
    for l, ((U_A, U_G), A, G) in enumerate(zip(last["U"], last["A"], last["G"])):
        pi = kron.factored_damping_pi(A, G)
        A_inv = np.linalg.inv(A + pi * math.sqrt(g) * np.eye(len(A)))
        G_inv = np.linalg.inv(G + math.sqrt(g) / pi * np.eye(len(G)))
        print(f"torchsso's sampler, layer {l}: input side U_A^T U_A vs A_g^-1 "
              f"{_rel(U_A.T @ U_A, A_inv):.1e}; output side U_G U_G^T vs G_g^-1 "
              f"{_rel(U_G @ U_G.T, G_inv):.2e} "
              f"(U_G^T U_G vs G_g^-1 {_rel(U_G.T @ U_G, G_inv):.1e})")
    return 0 if max(max(v) for v in errors.values()) <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
