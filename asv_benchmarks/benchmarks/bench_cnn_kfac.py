"""LeNet-5's K-FAC factors (issue 34 section 6): ``CNN.kfac_curvature`` of every parameter layer,
"ggn" (exact output-Hessian factor) and "ef" (the gradients at y), "expand" and "reduce"
(conv.26)-(conv.29), float64 and float32, on NumPy and CuPy, on bench_cnn's inputs (LeNet-5,
3x32x32, M = 128, default_rng(0)).

BackPACK's KFLR / KFAC on the same net and batch are timed beside refbayes' "expand" factors in
one process by tools/cnn_timing.py (the table is in derivations/conv_experiments.md); asv's
figures here track refbayes' own cost across commits.
"""
from .bench_cnn import DTYPES, inputs, model
from .common import BACKENDS, backend, sync


class LeNetKFACFactors:
    """[(A_l, B_l)] for the 5 parameter layers of LeNet-5."""
    params = (BACKENDS, ["ggn", "ef"], ["expand", "reduce"], DTYPES)
    param_names = ["backend", "curvature", "approx", "dtype"]

    def setup(self, name, curvature, approx, dtype):
        self.xp = backend(name)
        self.net = model()
        self.theta, self.X, self.y = inputs(self.xp, dtype)
        self.net.kfac_curvature(self.theta, self.X, self.y, curvature, approx)
        sync(self.xp)

    def time_kfac_curvature(self, name, curvature, approx, dtype):
        self.net.kfac_curvature(self.theta, self.X, self.y, curvature, approx)
        sync(self.xp)
