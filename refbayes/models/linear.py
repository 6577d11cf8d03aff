"""Logistic and softmax regression: one-layer FlatModels with closed-form curvature.

Implements (peg.20) of derivations/per_example_gradients.md. With an intercept, theta =
[vec_row_major(W) (n_features * C), b (C,)], the same layout as ``MLP([n_features, C])``, and
f = X W + b = add_intercept(X) @ [W; b^T] (the ones column is the LAST column). Without an
intercept, theta = vec_row_major(W) and f = X W. Gradients, per-example gradients, the Jacobian,
diag_ef and kfac_factors come from the shared layer machinery (FlatModel); ggn, hessian and
diag_ggn use the closed forms below, where the Hessian equals the GGN because f is linear in
theta.
"""
from __future__ import annotations

from refbayes._checks import check_array, check_int
from refbayes.backend import xp_of
from refbayes.models import _layers
from refbayes.models.base import FlatModel
from refbayes.models.likelihoods import Bernoulli, Categorical

__all__ = ["LogisticRegression", "SoftmaxRegression", "add_intercept"]


def add_intercept(X):
    """Append a column of ones to X as its LAST column, in X's dtype.

    Parameters
    ----------
    X : array of shape (M, n)
        Inputs.

    Returns
    -------
    array of shape (M, n + 1)
        The matrix [X, 1].

    Raises
    ------
    ValueError
        If X is not a finite real 2-d array.
    """
    xp = xp_of(X)
    check_array(X, "X", ndim=2)
    return xp.concatenate([X, xp.ones((X.shape[0], 1), dtype=X.dtype)], axis=1)


def _ggn_closed_form(xp, Xd, H):
    """sum_i (x~_i x~_i^T) kron H_i (P C, P C), rows (p, c) and columns (q, d) in theta's
    row-major (feature, class) order, for the design X~ (M, P) and H (M, C, C).  (peg.20)"""
    P, C = Xd.shape[1], H.shape[1]
    if C == 1:
        return Xd.T @ (Xd * H[:, 0, :])  # X~^T diag(h) X~: one GEMM  (peg.20)
    return xp.einsum("mp,mq,mcd->pcqd", Xd, Xd, H).reshape(P * C, P * C)  # (peg.20)


def _diag_ggn_closed_form(xp, Xd, H):
    """diag of ``_ggn_closed_form``: sum_i (x~_ip)^2 H_i[c, c] at entry (p, c).  (peg.20)"""
    return ((Xd * Xd).T @ xp.diagonal(H, axis1=1, axis2=2)).reshape(-1)  # (peg.20)


class _LinearModel(FlatModel):
    __slots__ = ()
    # One layer: the vectorized rows r_i x~_i are a single BLAS-backed outer product, measured
    # 19x faster than the numba loops at D = 1e4, M = 32 (6.5 ms vs 0.35 ms, one core).
    _numpy_impl = "vectorized"
    hessian_on_cupy = True  # the Hessian is the GGN, in closed form (peg.20)

    def _design(self, xp, X):
        return add_intercept(X) if self.bias else X

    def _curvature_inputs(self, theta, X, y):
        """(xp, X~ (M, P) the design, H (M, C, C)) with f = X~ W~ and W~ = theta.reshape(P, C)."""
        xp, theta, X, y = self._inputs(theta, X, y)
        f = self._forward(xp, theta, X)[2]
        return xp, self._design(xp, X), self.likelihood._hess_f(f, y)

    def _summed_curvature_inputs(self, thetas, X, y):
        """(xp, X~ (M, P), sum_s H_i(theta_s) (M, C, C)) for S parameter vectors, from one batched
        forward pass f_s = X~ W~_s."""
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        M, C = X.shape[0], self.sizes[-1]
        F = _layers.forward_batched(xp, _layers.unflatten_batched(thetas, self.sizes, self.bias),
                                    X, self.activation)[1]  # (S, M, C)  (peg.1)
        yy = xp.concatenate([y] * S) if S > 1 else y
        H = self.likelihood._hess_f(F.reshape(S * M, C), yy).reshape(S, M, C, C)
        return xp, self._design(xp, X), H.sum(axis=0)

    def ggn_sum(self, thetas, X, y):
        """Form sum_s GGN(theta_s) over S parameter vectors in closed form.

        (peg.20) is linear in H_i, so the sum is sum_i (x~_i x~_i^T) kron (sum_s H_i(theta_s)):
        one batched forward pass and one contraction for the S vectors (Monte Carlo samples),
        instead of S calls of ``ggn``. Equal to the Hessian's sum, as for ``hessian``.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_features)
            Inputs without the ones column, M >= 1, same dtype as thetas.
        y : array of shape (M,)
            Class labels.

        Returns
        -------
        array of shape (D, D)
            The summed GGN.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel; here X has n_features columns, without
            the ones column).
        """
        xp, Xd, H = self._summed_curvature_inputs(thetas, X, y)
        return _ggn_closed_form(xp, Xd, H)  # (peg.20)

    def diag_ggn_sum(self, thetas, X, y):
        """Compute sum_s diag GGN(theta_s) over S parameter vectors in closed form.

        (peg.20) with sum_s H_i(theta_s) in place of H_i, as in ``ggn_sum``: the diagonal
        sum_i (x~_ip)^2 sum_s H_i(theta_s)[c, c] at entry (p, c).

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_features)
            Inputs without the ones column, M >= 1, same dtype as thetas.
        y : array of shape (M,)
            Class labels.

        Returns
        -------
        array of shape (D,)
            The summed GGN diagonal.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel; here X has n_features columns, without
            the ones column).
        """
        xp, Xd, H = self._summed_curvature_inputs(thetas, X, y)
        return _diag_ggn_closed_form(xp, Xd, H)  # (peg.20)

    def _hessian_sum(self, thetas, X, y, diag=False):
        """The Hessian is the GGN (peg.20): its sum over the S vectors in one pass."""
        return self.diag_ggn_sum(thetas, X, y) if diag else self.ggn_sum(thetas, X, y)

    def ggn(self, theta, X, y):
        """Form the GGN sum_i (x~_i x~_i^T) kron H_i in closed form.

        Entries in theta's (feature, class) row-major order; x~_i is the design row (with the
        ones column when the model has an intercept).  (peg.20)

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_features)
            Inputs without the ones column, M >= 1, same dtype as theta.
        y : array of shape (M,)
            Class labels.

        Returns
        -------
        array of shape (D, D)
            The GGN.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel; here X has n_features columns, without
            the ones column).
        """
        xp, Xd, H = self._curvature_inputs(theta, X, y)
        return _ggn_closed_form(xp, Xd, H)  # (peg.20)

    def hessian(self, theta, X, y):
        """Form the Hessian of sum_i l_i, which equals the GGN since d^2 f / d theta^2 = 0.

        (peg.20)  Unlike ``FlatModel.hessian``, this closed form runs on NumPy or CuPy.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_features)
            Inputs without the ones column, M >= 1, same dtype as theta.
        y : array of shape (M,)
            Class labels.

        Returns
        -------
        array of shape (D, D)
            The Hessian.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel; here X has n_features columns, without
            the ones column).
        """
        return self.ggn(theta, X, y)

    def diag_ggn(self, theta, X, y):
        """Compute the GGN diagonal in closed form: sum_i (x~_ip)^2 H_i[c, c] at entry (p, c).

        (peg.20)

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_features)
            Inputs without the ones column, M >= 1, same dtype as theta.
        y : array of shape (M,)
            Class labels.

        Returns
        -------
        array of shape (D,)
            The diagonal of the GGN.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel; here X has n_features columns, without
            the ones column).
        """
        xp, Xd, H = self._curvature_inputs(theta, X, y)
        return _diag_ggn_closed_form(xp, Xd, H)  # (peg.20)


class LogisticRegression(_LinearModel):
    """Logistic regression p(y=1 | x) = sigma(x w + b), y in {0, 1}.

    theta = [w (n_features,), b] with intercept (D = n_features + 1), else w. Same loss,
    gradients and layout as ``MLP([n_features, 1], likelihood="bernoulli")``. The GGN (= Hessian)
    is X~^T diag(s (1 - s)) X~ with s = sigma(f). (peg.20)

    Parameters
    ----------
    n_features : int
        Number of input features, >= 1.
    intercept : bool, default True
        Whether theta ends with an intercept b.

    Raises
    ------
    ValueError
        If n_features is not an integer >= 1.
    """

    __slots__ = ()

    def __init__(self, n_features, intercept=True):
        n = check_int(n_features, "n_features", low=1)
        super().__init__((n, 1), "none", Bernoulli(), bias=bool(intercept))

    @property
    def intercept(self) -> bool:
        """Whether theta ends with an intercept (the same as ``bias``)."""
        return self.bias

    def __repr__(self):
        return f"LogisticRegression({self.sizes[0]}, intercept={self.bias})"


class SoftmaxRegression(_LinearModel):
    """Softmax regression p(y=c | x) = softmax(x W + b)_c, labels 0..C-1.

    theta = [vec_row_major(W) (n_features * C), b (C,)] with intercept, else vec(W).
    Same layout as ``MLP([n_features, C], likelihood="categorical")``. (peg.20)

    Parameters
    ----------
    n_features : int
        Number of input features, >= 1.
    n_classes : int
        Number of classes C, >= 2.
    intercept : bool, default True
        Whether theta ends with the intercepts b.

    Raises
    ------
    ValueError
        If n_features is not an integer >= 1 or n_classes not an integer >= 2.
    """

    __slots__ = ()

    def __init__(self, n_features, n_classes, intercept=True):
        n = check_int(n_features, "n_features", low=1)
        C = check_int(n_classes, "n_classes", low=2)
        super().__init__((n, C), "none", Categorical(), bias=bool(intercept))

    @property
    def intercept(self) -> bool:
        """Whether theta ends with the intercepts (the same as ``bias``)."""
        return self.bias

    def __repr__(self):
        return f"SoftmaxRegression({self.sizes[0]}, {self.sizes[1]}, intercept={self.bias})"
