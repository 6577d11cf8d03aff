"""Dense oracle for refbayes.methods.riemannian_laplace: the metric M(c) = I + g g^T formed as a
matrix, its derivative dM/dc by autograd (a Jacobian of the map c -> M(c), no closed form), the
geodesic acceleration in the printed general Christoffel form (riemannian_laplace.3) with an
explicit D x D solve, and a solve_ivp driver on [0, t1] for that right-hand side; the negative
log posterior L, on all rows or on a minibatch scaled by N / M, of the network or of the network
linearized at a point (riemannian_laplace.14), (riemannian_laplace.17), written out as
autograd-traceable functions, whose gradients and Hessians autograd forms densely.

L is an autograd-traceable scalar function of theta (the summed loss of the network of
tests.reference.per_example plus the prior term); nothing here uses the Sherman-Morrison
simplification, a Hessian-vector product, a GGN or refbayes.models.
"""
import autograd
import autograd.numpy as anp
import numpy as np
from scipy.integrate import solve_ivp


def metric_fn(L):
    """c -> M(c) = I_D + grad L(c) grad L(c)^T, autograd-traceable.  (riemannian_laplace.1)"""
    grad_L = autograd.grad(L)

    def M(c):
        g = grad_L(c)
        return anp.eye(c.shape[0]) + anp.outer(g, g)
    return M


def christoffel_acceleration(L, c, cdot):
    """c'' = -(M^{-1}/2) [2 [dM/dc_1, ..., dM/dc_D] - d vec[M]^T / dc] (c' kron c'), as printed.

    [dM/dc_1, ..., dM/dc_D] is D x D^2 (block k = dM/dc_k); d vec[M] / dc is D^2 x D with vec
    column-stacking (row i + D j holds dM_ij / dc); c' kron c' has entry k D + j = c'_k c'_j.
    (riemannian_laplace.3)
    """
    D = c.shape[0]
    M_of = metric_fn(L)
    M = M_of(c)
    dM = np.asarray(autograd.jacobian(M_of)(c))              # dM[i, j, k] = dM_ij / dc_k
    A = np.concatenate([dM[:, :, k] for k in range(D)], axis=1)     # D x D^2
    B = np.transpose(dM, (1, 0, 2)).reshape(D * D, D)              # row i + D j = dM_ij / dc
    kk = np.kron(cdot, cdot)
    return -0.5 * np.linalg.solve(M, (2.0 * A - B.T) @ kk)


def solve_geodesic(L, theta, v, t1=1.0, rtol=1e-12, atol=1e-12):
    """(c(t1), c'(t1)) of c'' = christoffel_acceleration, c(0) = theta, c'(0) = v, by DOP853."""
    D = theta.shape[0]

    def rhs(t, y):
        return np.concatenate([y[D:], christoffel_acceleration(L, y[:D], y[D:])])

    sol = solve_ivp(rhs, (0.0, t1), np.concatenate([theta, v]), method="DOP853",
                    rtol=rtol, atol=atol)
    assert sol.status == 0, sol.message
    return sol.y[:D, -1], sol.y[D:, -1]



def _data_term(spec, f, Y):
    """sum_i l(y_i, f_i), written out for the gaussian and bernoulli likelihoods (autograd)."""
    if spec.likelihood == "gaussian":
        N, K = f.shape
        r = Y.reshape(f.shape) - f
        return 0.5 * spec.tau * anp.sum(r ** 2) + N * (0.5 * K * np.log(2 * np.pi)
                                                        - 0.5 * K * np.log(spec.tau))
    a = f[:, 0]
    return anp.sum(Y * anp.log1p(anp.exp(-a)) + (1 - Y) * anp.log1p(anp.exp(a)))


def _rows_and_scale(X, Y, rows):
    """The rows B of (X, Y) and the scale N / M ((riemannian_laplace.14)); all rows and 1 when
    rows is None."""
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    if rows is None:
        return X, Y, 1.0
    return X[rows], Y[rows], X.shape[0] / len(rows)


def _check_spec(spec):
    if spec.likelihood not in ("gaussian", "bernoulli"):
        raise ValueError("spec.likelihood: expected 'gaussian' or 'bernoulli', got "
                         f"{spec.likelihood!r}")


def posterior_loss(spec, X, Y, delta, rows=None):
    """theta -> L(theta) = (N / M) sum_{i in B} l_i(theta) + (1/2) sum_d delta_d theta_d^2,
    autograd-traceable, for a gaussian or bernoulli spec (delta a float or a (D,) array; B all
    rows, scale 1, when rows is None); the network is tests.reference.per_example.naive_output
    applied to all rows at once (its products are row-wise), the losses written out here; never
    imports refbayes.models.  (riemannian_laplace.14)"""
    from tests.reference.per_example import naive_output
    _check_spec(spec)
    Xb, Yb, scale = _rows_and_scale(X, Y, rows)

    def L(theta):
        return scale * _data_term(spec, naive_output(spec, theta, Xb), Yb) \
            + 0.5 * anp.sum(delta * theta ** 2)
    return L


def linearized_posterior_loss(spec, X, Y, delta, theta_lin, rows=None):
    """theta -> L_lin(theta): posterior_loss with the network replaced by its linearization at
    theta_lin, f_lin = f(theta_lin) + J (theta - theta_lin), J (M, K, D) the Jacobian of
    naive_output at theta_lin by autograd, formed densely once.  (riemannian_laplace.16),
    (riemannian_laplace.17)"""
    import autograd
    from tests.reference.per_example import naive_output
    _check_spec(spec)
    Xb, Yb, scale = _rows_and_scale(X, Y, rows)
    theta_lin = np.array(theta_lin, dtype=np.float64)
    f0 = np.asarray(naive_output(spec, theta_lin, Xb))                                # (M, K)
    J = np.asarray(autograd.jacobian(lambda th: naive_output(spec, th, Xb))(theta_lin))  # (M, K, D)

    def L_lin(theta):
        f = f0 + anp.dot(J, theta - theta_lin)
        return scale * _data_term(spec, f, Yb) + 0.5 * anp.sum(delta * theta ** 2)
    return L_lin
