"""The scale of every traced quantity, in words: the one table the manifest's ``scale`` entries
and the printed trace's "scales:" section are read from (``derivations/tracing.md``, "Scales").

A tag names the equation; the scale says which sum over data the value is: the raw sum over the
M minibatch examples (BBB's g, (bbb.4)), N / (M S) times the sum over examples and draws (its
g_hat, (bbb.5)), a per-example mean (VOGN's g_hat, (vogn.5)), the sum over all N (a Laplace
curvature), or none (a parameter, a draw, a step, a count). ``SCALES[method]`` names every output
of the method's trace by its name before the first '.' (``A_hat`` for ``A_hat.0``; ``state.adam``
for ``state.adam.m``: the longest prefix listed wins); the inputs take ``input_scale``.
"""
from __future__ import annotations

__all__ = ["SCALES", "input_scale", "scale_of"]

# the phrases, each used by several methods
NONE = "none: a value (parameter, draw, step or factor), not a sum over data"
COUNT = "none: a count"
STEP_SIZE = "none: a step size"
PER_EXAMPLE = "per example and draw: one example's gradient at one draw, unscaled"
SUM_M_PER_DRAW = "per draw: the sum over the M minibatch examples, unscaled (no N / M)"
MEAN_M_PER_DRAW = "per draw: the mean over the M minibatch examples (1 / M times their sum)"
MEAN_MS = "per-example mean: 1 / (M S) times the sum over the M minibatch examples and S draws"
NMS = ("N / (M S) times the sum over the M minibatch examples and S draws: an estimate of the "
       "sum over all N examples")
NMS_OBJ = ("N / (M S) times the sum over the M minibatch examples and S draws, plus the prior "
           "term: the whole objective's gradient")
NM = "N / M times the sum over the M minibatch examples: an estimate of the sum over all N"
NM_OBJ = ("N / M times the sum over the M minibatch examples, plus the prior term: the whole "
          "objective's gradient")
PRECISION = ("full data: the precision, N / (M S)-scaled minibatch curvature (running) plus the "
             "prior precision")
FULL_SUM = "the sum over all N training examples"
PER_EXAMPLE_RUNNING = "per-example scale: a running average (or sum) of per-example means"
ADAM_M = "running average of the whole objective's gradient (its scale)"
ADAM_V = "running average of the whole objective's squared gradient (its scale)"

_ADAM_STATE = {"state.adam.m": ADAM_M, "state.adam.v": ADAM_V, "state.adam.t": COUNT,
               "state.t": COUNT}

_SLANG = {
    "alpha_t": STEP_SIZE, "beta_t": STEP_SIZE, "theta": NONE, "G": PER_EXAMPLE,
    "W": "columns sqrt(1 - beta_t) U, then sqrt(beta_t N / (M S)) times each example's "
         "gradient at each draw: W W^T is on the full-data precision's scale",
    "U": PRECISION + " (its low-rank factor)",
    "Delta_d": "full data: the diagonal of W W^T - U U^T (W's scale)",
    "d": PRECISION + " (its diagonal part)", "g_tilde": NMS_OBJ,
    "direction": NMS_OBJ + " (bias-corrected momentum average of it)",
    "Delta_mu": NONE, "mu": NONE,
    "state.g_bar": NMS + " (momentum average, the prior term excluded)", "state.t": COUNT}
_NGVI = {
    "alpha_t": STEP_SIZE, "beta_t": STEP_SIZE, "theta": NONE, "G": PER_EXAMPLE, "g_hat": NMS,
    "C_hat": NMS + " (of per-example outer products)",
    "c_hat": NMS + " (of per-example squares)",
    "Sigma_inv": PRECISION, "prec_diag": PRECISION, "g_tilde": NMS_OBJ,
    "direction": NMS_OBJ + " (bias-corrected momentum average of it)",
    "Delta_mu": NONE, "mu": NONE,
    "state.g_bar": NMS + " (momentum average, the prior term excluded)", "state.t": COUNT}
_VOGN = {
    "N_eff": "none: the effective number of examples rho N",
    "delta_tilde": "per example: tau delta / N_eff, the prior precision over N_eff",
    "sigma": NONE, "theta": NONE, "g_k": MEAN_M_PER_DRAW,
    "h_k": MEAN_M_PER_DRAW + " (of per-example squares or GGN diagonals)",
    "g_hat": MEAN_MS, "h_hat": MEAN_MS + " (of per-example squares or GGN diagonals)",
    "m": PER_EXAMPLE_RUNNING + " (heavy-ball sum of g_hat + delta_tilde mu)",
    "s": PER_EXAMPLE_RUNNING + " (of h_hat)",
    "prec_diag": "full data: (N_eff / tau) times the per-example-scale s + delta_tilde + gamma",
    "Delta_mu": NONE, "mu": NONE, "state.t": COUNT}
_VADAM = {
    "sigma": NONE, "theta": NONE, "g": MEAN_M_PER_DRAW, "g_hat": MEAN_MS,
    "h_hat": "per-example scale squared: the mean over the S draws of the squared per-draw "
             "minibatch means g_s o g_s",
    "m": PER_EXAMPLE_RUNNING + " (of g_hat)", "s": PER_EXAMPLE_RUNNING + " (of h_hat)",
    "m_hat": PER_EXAMPLE_RUNNING + " (of g_hat), bias-corrected",
    "s_hat": PER_EXAMPLE_RUNNING + " (of h_hat), bias-corrected",
    "denom": "per-example scale: sqrt(s_hat) (or s_hat) plus lam_tilde",
    "Delta_mu": NONE, "mu": NONE, "state.t": COUNT}
_NOISY_ADAM = {
    "gamma_in": "per example: kl_weight eta / N", "sigma": NONE, "w": NONE,
    "g": MEAN_M_PER_DRAW, "g_hat": MEAN_MS,
    "h_hat": "per-example scale squared: the mean over the S draws of the squared per-draw "
             "minibatch means",
    "v": "per-example scale: g_hat plus gamma_in times the mean draw",
    "m": PER_EXAMPLE_RUNNING + " (of v)", "f": PER_EXAMPLE_RUNNING + " (of h_hat)",
    "m_tilde": PER_EXAMPLE_RUNNING + " (of v), bias-corrected",
    "m_hat": "none: m_tilde over f + gamma, a ratio of per-example-scale quantities",
    "mu": NONE, "state.t": COUNT}
_BBB = {
    "sigma": NONE, "theta": NONE, "g": SUM_M_PER_DRAW, "g_hat": NMS,
    "g_rho": NMS + " (of g_s * eps_s * sigmoid(rho))", "g_sigma": NMS + " (of g_s * eps_s)",
    "kl": "whole objective: KL(q || p) over all D parameters (no N scaling)",
    "grad_mu": NMS_OBJ, "grad_rho": NMS_OBJ + " (in rho)", "grad_sigma": NMS_OBJ + " (in sigma)",
    "loss_hat": NMS + " (of the losses)",
    "elbo": "whole objective: -(loss_hat + kl_weight kl), the ELBO of all N examples",
    "delta": NONE, "mu": NONE, "rho": NONE, "state.k": "none: the tie ranks k_l",
    **_ADAM_STATE}
_MAP = {"f": "per example: the masked outputs of each of the M minibatch rows",
        "g_data": NM, "g": NM_OBJ, "delta": NONE, "theta": NONE, **_ADAM_STATE}
_SWAG = {
    "g": NM_OBJ + " (at each of the T SGD steps)",
    "v": "running sum (momentum) of g: the whole objective's gradient scale",
    "theta": NONE, "theta_bar": NONE + " (running mean of the iterates)",
    "theta2_bar": "none: running mean of the iterates' squares",
    "dev": NONE, "Sigma_diag": "none: a parameter variance", "D_hat": NONE,
    "Sigma": "none: a parameter covariance", "theta_s": NONE, "theta_s_diag": NONE,
    "log_q": "none: a log density in D dimensions", "log_q_diag": "none: a log density in D "
                                                                 "dimensions"}
_NOISY_KFAC = {
    "pi": "none: the damping split, a ratio of factor traces", "w": NONE,
    "V": "per-example scale: 1 / (M S) times the sum of the gradients over the M minibatch "
         "examples and S draws, plus gamma_in times the mean draw",
    "P": "per-example scale: V preconditioned by the per-example-scale damped factors",
    "m": "per-example scale: the momentum sum of P", "mu": NONE,
    "A_hat": "per-example mean: the mean over the M minibatch examples (and S draws) of "
             "a~ a~^T",
    "S_hat": "per-example mean: the mean over the M minibatch examples (and S draws) of "
             "ds ds^T",
    "nu": "none: the KL-clipping factor",
    "A": PER_EXAMPLE_RUNNING + " (of A_hat)", "S": PER_EXAMPLE_RUNNING + " (of S_hat)",
    "state.A_ref": PER_EXAMPLE_RUNNING + " (A at the last refresh)",
    "state.S_ref": PER_EXAMPLE_RUNNING + " (S at the last refresh)", "state.t": COUNT}
_LAPLACE = {
    "H": FULL_SUM + " (the curvature of sum_i l_i)",
    "precision": "full data: H plus the prior precision", "theta_s": NONE,
    "log_lik": FULL_SUM + " (of log p(y_i | theta*))",
    "log_prior": "none: the log prior density at theta*",
    "log_det": "none: the log-determinant of the full-data precision",
    "log_Z": "whole objective: the log marginal likelihood of all N examples",
    "log_det_ratio": "none: log-determinants of the full-data precision and the prior",
    "scatter": "none: the prior's quadratic form at theta*",
    "f_mean": "per test input: each of the M* rows of X_star",
    "f_var": "per test input: each of the M* rows of X_star",
    "y_var": "per test input: each of the M* rows of X_star",
    "V": NONE, "g": FULL_SUM + " of the gradients, plus the prior term (grad L at the MAP)",
    "c": NONE, "cdot": NONE, "nfev": COUNT, "n_steps": COUNT,
    "speed_0": "none: a squared speed under the full-data metric",
    "speed_1": "none: a squared speed under the full-data metric"}

SCALES = {"slang": _SLANG, "slang-mlp": _SLANG, "ngvi-full": _NGVI, "ngvi-meanfield": _NGVI,
          "vogn": _VOGN, "ogn": _VOGN, "vadam": _VADAM, "vprop": _VADAM,
          "noisy-adam": _NOISY_ADAM, "bbb": _BBB, "ktied": _BBB, "mc-dropout": _MAP,
          "adam": _MAP, "swag": _SWAG, "noisy-kfac": _NOISY_KFAC, "kfac": _NOISY_KFAC,
          "laplace": _LAPLACE, "riemannian-laplace": _LAPLACE}

_INPUT_GROUPS = (
    ("input.state.", "none: the starting state"),
    ("input.batch.idx", "none: the minibatch's row indices"),
    ("input.batch.", "none: the data rows the step consumes"),
    ("input.eps", "none: standard-normal draws"),
    ("input.masks.", "none: dropout masks"),
    ("input.cfg.", "none: a config value"),
    ("input.map.", "none: a point of the MAP search"),
    ("input.X_star", "none: test inputs"),
    ("input.u", "none: uniform draws"),
    ("input.probs", "per example and draw: the predictive probabilities"),
    ("input.y_tilde", "per example and draw: a sampled label"),
)


def input_scale(name: str) -> str:
    """The scale of an input: its group's (``input.state.``, ``input.batch.``, ...).

    Parameters
    ----------
    name : str
        An input's name, e.g. 'input.batch.X'.

    Returns
    -------
    str
        The phrase; "none: a recipe input" for an input of no listed group (input.Omega, ...).
    """
    return next((s for prefix, s in _INPUT_GROUPS if name.startswith(prefix)),
                "none: a recipe input")


def scale_of(method: str, name: str) -> str | None:
    """The scale of one output of a method's trace, from ``SCALES``.

    Parameters
    ----------
    method : str
        The traced method.
    name : str
        The output's name, e.g. 'g_hat', 'A_hat.0', 'state.adam.m'.

    Returns
    -------
    str or None
        The phrase of the longest listed prefix of the name (by '.'-separated parts), or None
        when the table lists none (a test keeps every output listed).
    """
    table = SCALES.get(method, {})
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            return table[key]
    return None
