"""Issue 34 section 6: LeNet-5 per-example gradients, refbayes against torch.func and BackPACK,
and a refbayes VOGN step against a refbayes Adam step, side by side in one process.

Run with the torch environment and one thread everywhere::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 /work/tvenv/bin/python tools/cnn_timing.py

LeNet-5 (refbayes.models.conv.lenet5, 3x32x32, ten classes, D = 62006), M = 128, float64 and
float32. X standard normal, y labels, theta Glorot (seeds 0, as asv_benchmarks' bench_cnn).

- refbayes: ``CNN.per_example_grads(impl="vectorized")``, G (M, D) in theta order.
- torch.func: ``vmap(grad(loss of one example))`` over a real ``nn.Module`` LeNet-5 loaded from
  the same theta (conv weights in theta's layout as they are, dense weights transposed), via
  ``functional_call``; timed to its per-parameter dict (no (M, D) assembly).
- BackPACK: ``extend``ed model and ``CrossEntropyLoss(reduction="sum")``, ``BatchGrad``; timed
  forward + backward to the ``grad_batch`` tensors (no (M, D) assembly).

Before timing, each torch result is flattened to theta order and compared with refbayes' G:
max |diff| / max |G| must be <= 1e-10 (float64) or 1e-4 (float32), else the script stops.

K-FAC factors of every layer: refbayes ``kfac_curvature`` ("expand"; "ggn", and "ef" at the
labels, the form BackPACK's one-sample KFAC takes with sampled labels) against BackPACK's KFLR
(exact GGN) and KFAC (one Monte Carlo label per example), forward + backward to the factors.
Their agreement (after the conventions of derivations/conv.md) is checked by ``refbayes
conformance backpack``, not here.

Then one refbayes Adam step (``adam.step``, summed gradient) and one VOGN step (``vogn.step``,
S = 1, "ef") on the same net and batch, N = 50000; the VOGN / Adam ratio is the issue's figure
(goal <= 3x).

With ``--before DIR`` (DIR holding copies of an older ``refbayes/models/conv.py`` and
``_conv_layers.py``), that code's ``per_example_grads`` is loaded under a private module name and
timed in the same rounds ("refbayes before"), the "before" figure of a change.

Every case is timed interleaved with the others, round by round (median of ROUNDS), so the
machine's drifts fall on all alike; the load average is printed at start and end: on a loaded
machine the absolute times are noisy, the ratios less so.
"""
import importlib.util
import os
import sys
import timeit
import types
import warnings

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from refbayes.conformance.backpack import torch_cnn
from refbayes.methods import adam, vogn
from refbayes.methods._estimates import Batch
from refbayes.models.conv import Conv2d, Dense, lenet5

M = 128
N = 50000
LAM = 1.0
S0 = 1e4 / N
T = 10
ROUNDS = 9
MIN_TIME = 0.2
TOL = {"float64": 1e-10, "float32": 1e-4}


def load_before(folder):
    """An older conv.py (with its _conv_layers.py) from ``folder``, as a private module."""
    spec = importlib.util.spec_from_file_location("_cnn_before_layers",
                                                  os.path.join(folder, "_conv_layers.py"))
    layers = importlib.util.module_from_spec(spec)
    sys.modules["_cnn_before_layers"] = layers
    spec.loader.exec_module(layers)
    path = os.path.join(folder, "conv.py")
    with open(path) as fh:
        src = fh.read().replace("from refbayes.models import _conv_layers as cl",
                                "import _cnn_before_layers as cl")
    mod = types.ModuleType("_cnn_before")
    mod.__file__ = path
    sys.modules["_cnn_before"] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


BEFORE = None


def torch_lenet5():
    """refbayes' lenet5() as an nn.Sequential (the conformance reports' builder), float64."""
    return torch_cnn(lenet5())


def load_theta(net, module, theta):
    """Copy refbayes' theta into ``module``: conv weights as they are, dense weights transposed."""
    tlayers = [m for m in module if isinstance(m, (nn.Conv2d, nn.Linear))]
    rlayers = [lay for lay in net.layers if isinstance(lay, (Conv2d, Dense))]
    assert len(tlayers) == len(rlayers)
    with torch.no_grad():
        for tm, rl, (W, b) in zip(tlayers, rlayers, net.unflatten(theta)):
            W = torch.from_numpy(np.ascontiguousarray(W))
            tm.weight.copy_(W if isinstance(rl, Conv2d) else W.T)
            tm.bias.copy_(torch.from_numpy(np.ascontiguousarray(b)))


def flatten_torch(module, per_param):
    """{name: (M, *shape)} per-example gradients -> (M, D) in refbayes' theta order."""
    cols = []
    for name, mod in module.named_children():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            gW, gb = per_param[f"{name}.weight"], per_param[f"{name}.bias"]
            if isinstance(mod, nn.Linear):
                gW = gW.transpose(-1, -2)  # torch's (n_out, n_in) -> refbayes' (n_in, n_out)
            cols += [gW.reshape(gW.shape[0], -1), gb.reshape(gb.shape[0], -1)]
    return torch.cat(cols, dim=1).numpy()


def rel_diff(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def cases_for(dtype):
    """{label: zero-argument callable} for one dtype, after the agreement checks."""
    from backpack import backpack, extend
    from backpack.extensions import KFAC, KFLR, BatchGrad

    net = lenet5()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((M,) + net.input_shape).astype(dtype)
    y = rng.integers(0, net.n_out, M)
    theta = net.init_theta(np.random.default_rng(0), dtype=np.dtype(dtype))
    tdtype = torch.float64 if dtype == "float64" else torch.float32

    G_ref = net.per_example_grads(theta, X, y, impl="vectorized")

    # torch.func: vmap of grad of one example's loss over a real nn.Module
    module = torch_lenet5().to(tdtype)
    load_theta(net, module, theta)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss_one(p, x, t):
        out = functional_call(module, p, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, t.unsqueeze(0), reduction="sum")

    pe_grad = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def run_func():
        return pe_grad(params, Xt, yt)

    # BackPACK: BatchGrad on an extended copy with the same weights and a summed loss
    bp_model = extend(torch_lenet5().to(tdtype))
    load_theta(net, bp_model, theta)
    bp_loss = extend(nn.CrossEntropyLoss(reduction="sum"))

    def run_backpack():
        bp_model.zero_grad()
        loss = bp_loss(bp_model(Xt), yt)
        with backpack(BatchGrad()):
            loss.backward()
        return {n: p.grad_batch for n, p in bp_model.named_parameters()}

    kf_model = extend(torch_lenet5().to(tdtype))
    load_theta(net, kf_model, theta)

    def backpack_factors(extension):
        def run():
            kf_model.zero_grad()
            loss = bp_loss(kf_model(Xt), yt)
            with backpack(extension()):
                loss.backward()
            return [getattr(p, extension.__name__.lower()) for p in kf_model.parameters()]
        return run

    tol = TOL[dtype]
    for label, fn, mod in (("torch.func", run_func, module), ("BackPACK", run_backpack, bp_model)):
        err = rel_diff(flatten_torch(mod, {k: v.detach() for k, v in fn().items()}), G_ref)
        print(f"  check {dtype} {label:<10} vs refbayes: max|diff|/max|G| = {err:.2e} (tol {tol:g})")
        if not err <= tol:
            sys.exit(f"{label} per-example gradients differ from refbayes' ({dtype}): {err:.2e}")

    # refbayes Adam step and VOGN step (S = 1, ef) on the same net and batch (rows form)
    batch = Batch(np.ascontiguousarray(X.reshape(M, -1)), y)
    st_a, cfg_a = adam.init(theta)._replace(t=T), adam.AdamConfig()
    st_v = vogn.init(theta, np.full(net.D, S0, dtype=theta.dtype))._replace(t=T)
    cfg_v = vogn.VOGNConfig(N, LAM, curvature="ef")
    eps = np.random.default_rng(1).standard_normal((net.D, 1)).astype(dtype)

    out = np.empty((M, net.D), dtype=dtype)
    cases = {
        "refbayes per_example_grads": lambda: net.per_example_grads(theta, X, y, impl="vectorized"),
        "refbayes per_example_grads out=": lambda: net.per_example_grads(theta, X, y, out=out),
        "torch.func vmap(grad)": run_func,
        "BackPACK BatchGrad": run_backpack,
        "refbayes kfac_curvature ggn": lambda: net.kfac_curvature(theta, X, y, "ggn", "expand"),
        "refbayes kfac_curvature ef": lambda: net.kfac_curvature(theta, X, y, "ef", "expand"),
        "BackPACK KFLR": backpack_factors(KFLR),
        "BackPACK KFAC (1 sample)": backpack_factors(KFAC),
        "refbayes grad": lambda: net.grad(theta, X, y),
        "refbayes Adam step": lambda: adam.step(st_a, batch, cfg_a, net, N, LAM),
        "refbayes VOGN step (S=1, ef)": lambda: vogn.step(st_v, batch, eps, cfg_v, net),
    }
    if BEFORE is not None:
        net_b = BEFORE.lenet5()
        err = rel_diff(net_b.per_example_grads(theta, X, y), G_ref)
        print(f"  check {dtype} refbayes before vs now: max|diff|/max|G| = {err:.2e}")
        cases["refbayes before"] = lambda: net_b.per_example_grads(theta, X, y)
    return cases


def interleaved_medians(cases, rounds, min_time):
    """{key: median seconds per call}, each case once per round in turn, after one warm-up."""
    for fn in cases.values():
        fn()
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            timer = timeit.Timer(fn)
            number = max(1, int(min_time / max(timer.timeit(1), 1e-9)))
            times[k].append(timer.timeit(number) / number)
    return {k: float(np.median(v)) for k, v in times.items()}


def main():
    global BEFORE
    if len(sys.argv) == 3 and sys.argv[1] == "--before":
        BEFORE = load_before(sys.argv[2])
    torch.set_num_threads(1)
    # BackPACK's module hooks fire on outputs (the inputs need no gradient): benign, said once here
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)  # noqa: the pin lasts for the process
    except ImportError:
        pass
    threads = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                               "MKL_NUM_THREADS")}
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, {threads}")
    cases = {}
    for dtype in ("float64", "float32"):
        for label, fn in cases_for(dtype).items():
            cases[dtype, label] = fn
    med = interleaved_medians(cases, ROUNDS, MIN_TIME)
    load1 = os.getloadavg()

    print(f"\nLeNet-5 (D = 62006), 3x32x32, M = {M}: median of {ROUNDS} interleaved rounds, "
          f"1 thread")
    print(f"{'case':<30} {'dtype':<8} {'ms':>9} {'ratio':>8}  ratio to")
    for dtype in ("float64", "float32"):
        ref_pe = med[dtype, "refbayes per_example_grads"]
        ref_adam = med[dtype, "refbayes Adam step"]
        labels = ("refbayes per_example_grads", "refbayes per_example_grads out=",
                  "torch.func vmap(grad)", "BackPACK BatchGrad")
        for label in labels + (("refbayes before",) if BEFORE is not None else ()):
            t = med[dtype, label]
            print(f"{label:<30} {dtype:<8} {1e3 * t:9.2f} {t / ref_pe:8.2f}  refbayes per_example_grads")
        ref_kf = med[dtype, "refbayes kfac_curvature ggn"]
        for label in ("refbayes kfac_curvature ggn", "refbayes kfac_curvature ef", "BackPACK KFLR",
                      "BackPACK KFAC (1 sample)"):
            t = med[dtype, label]
            print(f"{label:<30} {dtype:<8} {1e3 * t:9.2f} {t / ref_kf:8.2f}  refbayes kfac_curvature ggn")
        for label in ("refbayes grad", "refbayes Adam step", "refbayes VOGN step (S=1, ef)"):
            t = med[dtype, label]
            print(f"{label:<30} {dtype:<8} {1e3 * t:9.2f} {t / ref_adam:8.2f}  refbayes Adam step")
    for dtype in ("float64", "float32"):
        ref = med[dtype, "refbayes per_example_grads"]
        rf, rb = ref / med[dtype, "torch.func vmap(grad)"], ref / med[dtype, "BackPACK BatchGrad"]
        print(f"per-example ({dtype}): refbayes / torch.func {rf:.2f}, refbayes / BackPACK {rb:.2f}: "
              f"faster than both: {'yes' if max(rf, rb) < 1 else 'NO'}")
    for dtype in ("float64", "float32"):
        r = med[dtype, "refbayes VOGN step (S=1, ef)"] / med[dtype, "refbayes Adam step"]
        print(f"VOGN / Adam ({dtype}): {r:.2f}x (goal <= 3x): {'met' if r <= 3 else 'NOT met'}")
    print(f"\nload average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} "
          f"(2 cores; absolute times are noisy under load, the ratios less so)")


if __name__ == "__main__":
    main()
