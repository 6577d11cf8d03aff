"""Naive re-implementation of one Noisy Adam step (Zhang et al. 2018, Algorithm 1), written in the
paper's ASCENT form (log-likelihood gradients, mu <- mu + alpha m_hat) from
derivations/noisy_adam.md, so that the comparison with the library (which descends the loss) also
checks the sign conversion. Explicit loops over draws and examples; per-example gradients from
tests.reference.vadam_dense (hand formulas or autograd). float64 NumPy throughout.
"""
import numpy as np


def noisy_adam_step(mu, m, f, t, loss_grads, eps, N, prior_precision, alpha, beta1, beta2, kl=1.0,
                    gamma_ex=0.0, squares="minibatch", prior_sign=-1.0, grad_scale=1.0):
    """Algorithm 1's loop body with k = t + 1; prior_precision is NoisyAdamConfig's, the prior
    PRECISION 1 / eta_paper (the paper's eta is the prior variance).

    loss_grads: theta -> (M, D) per-example LOSS gradients (the log-likelihood gradient is their
    negative). prior_sign = -1 is the derived v = grad log p - gamma_in w; +1 reproduces the
    issue's printed "+ gamma_in w". grad_scale = M reproduces a gradient SUMMED over the minibatch
    (the printed "grad log p(D | w)") for the errata tests. -> (mu', m', f', w).
    """
    k = t + 1
    gamma_in = kl * prior_precision / N
    gamma = gamma_in + gamma_ex
    w = mu[:, None] + eps * np.sqrt(kl / N) / np.sqrt(f + gamma_in)[:, None]
    D, S = w.shape
    v, sq = np.zeros(D), np.zeros(D)
    for j in range(S):
        G = -grad_scale * loss_grads(w[:, j])          # per-example log-likelihood gradients
        M = G.shape[0]
        g_j = sum(G[i] for i in range(M)) / M          # grad_w log p(y | x, w), minibatch mean
        v += (g_j + prior_sign * gamma_in * w[:, j]) / S
        if squares == "minibatch":
            sq += g_j ** 2 / S
        else:
            sq += sum(G[i] ** 2 for i in range(M)) / (M * S)
    m = beta1 * m + (1 - beta1) * v
    f = beta2 * f + (1 - beta2) * sq
    m_tilde = m / (1 - beta1 ** k)
    m_hat = m_tilde / (f + gamma)
    return mu + alpha * m_hat, m, f, w
