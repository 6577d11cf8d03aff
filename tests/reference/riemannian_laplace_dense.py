"""Dense oracle for refbayes.methods.riemannian_laplace: the metric M(c) = I + g g^T formed as a
matrix, its derivative dM/dc by autograd (a Jacobian of the map c -> M(c), no closed form), the
geodesic acceleration in the printed general Christoffel form (riemannian_laplace.3) with an
explicit D x D solve, and a solve_ivp driver on [0, t1] for that right-hand side.

L is an autograd-traceable scalar function of theta (the summed loss of a model through its
``_autograd_loss`` plus the prior term); nothing here uses the Sherman-Morrison simplification
or a Hessian-vector product.
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



def posterior_loss(spec, X, Y, delta):
    """theta -> L(theta) = sum_i l_i(theta) + (delta / 2) theta^T theta, autograd-traceable, for a
    gaussian or bernoulli spec; the network is tests.reference.per_example.naive_output applied to
    all rows at once (its products are row-wise), the losses written out here; never imports
    refbayes.models."""
    from tests.reference.per_example import naive_output
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    if spec.likelihood not in ("gaussian", "bernoulli"):
        raise ValueError("spec.likelihood: expected 'gaussian' or 'bernoulli', got "
                         f"{spec.likelihood!r}")

    def L(theta):
        f = naive_output(spec, theta, X)                        # (N, K)
        if spec.likelihood == "gaussian":
            K = f.shape[1]
            r = Y.reshape(f.shape) - f
            data = (0.5 * spec.tau * anp.sum(r ** 2)
                    + X.shape[0] * (0.5 * K * np.log(2 * np.pi) - 0.5 * K * np.log(spec.tau)))
        else:
            a = f[:, 0]
            data = anp.sum(Y * anp.log1p(anp.exp(-a)) + (1 - Y) * anp.log1p(anp.exp(a)))
        return data + 0.5 * delta * anp.dot(theta, theta)
    return L
