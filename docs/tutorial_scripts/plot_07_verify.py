"""
Verify your implementation
==========================

refbayes is a reference: to check your own implementation of a method (PyTorch, JAX, NumPy),
feed it the inputs of a golden trace and compare what it computes, quantity by quantity, in the
order the step computes them. The README's three commands::

    refbayes trace vogn --steps 2 --save vogn.npz             # 1. the golden trace
    python examples/torch_verify.py vogn vogn.npz mine.npz    # 2. an implementation runs its inputs
    refbayes verify vogn.npz mine.npz --layout torch          # 3. compare; exit 0 ok, 1 diverged

There step 2 is a PyTorch VOGN (``--layout torch`` reads parameter axes in ``nn.Linear``'s
order). Here step 2 is a NumPy VOGN written in this page from the equations of
``derivations/vogn.md``, in refbayes' own parameter order (no ``--layout``), with one
deliberately wrong variant that the check catches at its equation.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from refbayes import tracing, verify
from refbayes.models import MLP

work = Path(tempfile.mkdtemp())
refbayes_cli = [sys.executable, "-m", "refbayes.cli"]

# %%
# 1. The golden trace
# -------------------
# ``refbayes trace METHOD --save FILE`` writes every input (state, minibatches, draws, config)
# and every named intermediate of every step, with a JSON manifest of equation tags.

subprocess.run(refbayes_cli + ["trace", "vogn", "--steps", "2", "--save", str(work / "vogn.npz")],
               check=True, stdout=subprocess.DEVNULL,
               env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
trace = tracing.load(work / "vogn.npz")
print(trace.model["repr"])
print("config:", trace.config)
print("inputs:", {k: v.shape for k, v in trace.inputs.items()})
print("outputs:", list(trace.outputs))

# %%
# 2. Your implementation, on the trace's inputs
# ---------------------------------------------
# VOGN's step as derivations/vogn.md writes it, (vogn.2)-(vogn.9); the per-example gradients
# come from the same model. ``bug=True`` plants the classic mistake: the square of the mean
# gradient in place of the mean of the squared per-example gradients.


def my_vogn(trace, bug=False):
    c, x = trace.config, trace.inputs
    model = MLP(**trace.model["args"])
    mu, s, m = x["input.state.mu"], x["input.state.s"], x["input.state.m"]
    out = {name: [] for name in ("sigma", "theta", "g_k", "h_k", "g_hat", "h_hat", "m", "s", "mu")}
    for k in range(trace.options["steps"]):
        X, y, eps = x["input.batch.X"][k], x["input.batch.y"][k], x["input.eps"][k]
        N_eff = c["rho"] * c["N"]
        delta_t = c["tau"] * c["delta"] / N_eff                                   # (vogn.2)
        sigma = np.sqrt(c["tau"] / (N_eff * (s + delta_t + c["gamma"])))          # (vogn.4)
        theta = mu[:, None] + sigma[:, None] * eps                                # (vogn.4)
        G = np.stack([model.per_example_grads(theta[:, j], X, y) for j in range(eps.shape[1])])
        g_k = G.mean(axis=1)                                                      # (vogn.5)
        h_k = g_k ** 2 if bug else (G ** 2).mean(axis=1)                          # (vogn.5)
        g_hat, h_hat = g_k.mean(axis=0), h_k.mean(axis=0)
        m = c["beta1"] * m + (g_hat + delta_t * mu)                               # (vogn.7)
        s = (1 - c["beta2"]) * s + c["beta2"] * h_hat                             # (vogn.8)
        mu = mu - c["alpha"] * m / (s + delta_t + c["gamma"])                     # (vogn.9)
        for name, value in zip(out, (sigma, theta, g_k, h_k, g_hat, h_hat, m, s, mu)):
            out[name].append(value)
    return {name: np.stack(values) for name, values in out.items()}


np.savez(work / "mine.npz", **my_vogn(trace))
np.savez(work / "bug.npz", **my_vogn(trace, bug=True))

# %%
# 3. Compare
# ----------
# ``refbayes verify`` prints one row per quantity and step and exits 0 when everything agrees.

run = subprocess.run(refbayes_cli + ["verify", str(work / "vogn.npz"), str(work / "mine.npz")],
                     capture_output=True, text=True)
print(run.stdout)
print("exit status:", run.returncode)

# %%
# The planted bug is caught at its equation, (vogn.5), with everything before it agreeing:

run = subprocess.run(refbayes_cli + ["verify", str(work / "vogn.npz"), str(work / "bug.npz")],
                     capture_output=True, text=True)
print(run.stdout)
print("exit status:", run.returncode)

# %%
# In a test suite, the same comparison raises an AssertionError with the report:

verify.assert_matches(work / "vogn.npz", my_vogn(trace))
try:
    verify.assert_matches(work / "vogn.npz", my_vogn(trace, bug=True))
except AssertionError as err:
    print(str(err).splitlines()[0])
