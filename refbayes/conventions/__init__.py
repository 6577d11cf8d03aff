"""Public implementations' hyperparameters <-> refbayes configs.

One pair of pure functions per public implementation: ``from_<library>(...)`` takes the public
constructor's keyword arguments (spelled as that library spells them) and returns the refbayes
Config whose ``step`` takes the same step; ``to_<library>(cfg)`` returns a dict of those keyword
arguments. ``from_<library>(**to_<library>(cfg)) == cfg`` to float rounding. Every conversion
is the one stated in the derivation note named below; nothing here is new. Quantities that live
in a method's initial STATE rather than in its Config (the initial precision) have their own
pair of functions. ``CONVENTIONS`` lists every pair.

Mapped (public -> refbayes):

- ``from_pytorch_sso_vogn`` / ``to_pytorch_sso_vogn``: torchsso ``VIOptimizer`` / ``VOGN``
  (cybertronai/pytorch-sso, used by team-approx-bayes/dl-with-bayes) -> ``vogn.VOGNConfig``;
  initial state: ``s0_from_pytorch_sso_init_precision`` / ``pytorch_sso_init_precision_from_s0``.
  derivations/vogn.md, "Conventions of public implementations".
- ``from_pytorch_sso_noisy_kfac`` / ``to_pytorch_sso_noisy_kfac``: torchsso ``VIOptimizer`` with
  Kronecker curvature (dl-with-bayes' Noisy K-FAC) -> ``noisy_kfac.NoisyKFACConfig`` (its
  weight decay, sampler damping and refresh order; the same step when the draws average to the
  mean). derivations/noisy_kfac.md, "Conventions of torchsso".
- ``from_emtiyaz_vogn`` / ``to_emtiyaz_vogn``: emtiyaz/vadam ``VOGN`` -> ``vogn.VOGNConfig``.
  derivations/vogn.md, same section.
- ``from_emtiyaz_vadam`` / ``to_emtiyaz_vadam``: emtiyaz/vadam ``Vadam`` ->
  ``vadam.VadamConfig``; ``from_emtiyaz_vprop`` / ``to_emtiyaz_vprop``: emtiyaz/vadam ``Vprop``
  -> ``vadam.VadamConfig`` (``vadam.vprop_config``). Initial state of all three emtiyaz/vadam
  optimizers: ``s0_from_emtiyaz_prec_init`` / ``emtiyaz_prec_init_from_s0``.
  derivations/vadam.md, "Conventions of public implementations".
- ``from_torch_sgd`` / ``to_torch_sgd``: ``torch.optim.SGD`` on the mean loss (the base
  optimizer of wjmaddox/swa_gaussian) -> ``swag.SGDConfig``; ``from_swa_gaussian`` /
  ``to_swa_gaussian``: swa_gaussian ``SWAG`` (and its ``sample(scale)``) -> ``swag.SWAGConfig``.
  derivations/swag.md, "Conventions of the official code".
- ``from_laplace_torch`` / ``to_laplace_torch``: aleximmer/Laplace ``Laplace(...)`` ->
  ``laplace.LaplaceConfig``. derivations/laplace.md, "Conventions of public implementations".
- ``from_slang_bbb`` / ``to_slang_bbb``: the Bayes-by-Backprop baseline of aaronpmishkin/SLANG
  (``torch.optim.Adam`` on the loss F_hat / N) -> ``bbb.BBBConfig``. derivations/bbb.md,
  "Conventions of public implementations".

Not mapped (the notes give no exact step-for-step conversion; see each note): the official
SLANG code (its PyTorch keyword names are not in slang.md, its randomized fast_eig drops columns
and clips Delta_d), Noisy Adam (the official ``adam_optimizer.py`` does not run), gd-zhang's
Noisy K-FAC (statistics at a fresh draw, identity inverses until ``TInv``, another sampling map
and momentum form: noisy_kfac.md C1-C3), MC dropout (Keras Adam's epsilon makes the map
step-dependent, and the training-target precision is a free choice), PyTorch-BayesianCNN and
Blundell et al. (no constructor keyword names in bbb.md), K-tied (no public implementation).

Every function validates its inputs and raises ``ValueError`` naming the argument, what was
expected and what was given. A public hyperparameter that refbayes cannot represent (a KL
warm-up, 'preconditioned' momentum, a temperature != 1, ...) is refused unless it is set to the
value that makes it a no-op; a refbayes field that the public code cannot represent (tempering
for emtiyaz/vadam, the "ggn" curvature for torchsso, ...) is refused by ``to_*`` likewise.

One module per public implementation, each re-exported here (``refbayes.conventions.X`` and
``from refbayes.conventions import X`` are the public spelling): ``pytorch_sso`` (torchsso VOGN
and Noisy K-FAC),
``emtiyaz_vadam`` (emtiyaz/vadam VOGN, Vadam, Vprop), ``swa_gaussian`` (torch SGD and SWAG),
``laplace_torch`` (aleximmer/Laplace), ``slang_bbb`` (the SLANG repository's BBB baseline); the
shared argument checks are in ``_common``. This module keeps the registry ``CONVENTIONS``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from refbayes.conventions.emtiyaz_vadam import (
    emtiyaz_prec_init_from_s0,
    from_emtiyaz_vadam,
    from_emtiyaz_vogn,
    from_emtiyaz_vprop,
    s0_from_emtiyaz_prec_init,
    to_emtiyaz_vadam,
    to_emtiyaz_vogn,
    to_emtiyaz_vprop,
)
from refbayes.conventions.laplace_torch import from_laplace_torch, to_laplace_torch
from refbayes.conventions.pytorch_sso import (
    from_pytorch_sso_noisy_kfac,
    from_pytorch_sso_vogn,
    pytorch_sso_init_precision_from_s0,
    s0_from_pytorch_sso_init_precision,
    to_pytorch_sso_noisy_kfac,
    to_pytorch_sso_vogn,
)
from refbayes.conventions.slang_bbb import from_slang_bbb, to_slang_bbb
from refbayes.conventions.swa_gaussian import (
    from_swa_gaussian,
    from_torch_sgd,
    swa_gaussian_z2_factor,
    to_swa_gaussian,
    to_torch_sgd,
)

__all__ = [
    "CONVENTIONS",
    "Convention",
    "emtiyaz_prec_init_from_s0",
    "from_emtiyaz_vadam",
    "from_emtiyaz_vogn",
    "from_emtiyaz_vprop",
    "from_laplace_torch",
    "from_pytorch_sso_noisy_kfac",
    "from_pytorch_sso_vogn",
    "from_slang_bbb",
    "from_swa_gaussian",
    "from_torch_sgd",
    "pytorch_sso_init_precision_from_s0",
    "s0_from_emtiyaz_prec_init",
    "s0_from_pytorch_sso_init_precision",
    "swa_gaussian_z2_factor",
    "to_emtiyaz_vadam",
    "to_emtiyaz_vogn",
    "to_emtiyaz_vprop",
    "to_laplace_torch",
    "to_pytorch_sso_noisy_kfac",
    "to_pytorch_sso_vogn",
    "to_slang_bbb",
    "to_swa_gaussian",
    "to_torch_sgd",
]


class Convention(NamedTuple):
    """One public implementation mapped onto a refbayes config.

    Attributes
    ----------
    name : str
        Registry key, the suffix of the function pair (``from_<name>``, ``to_<name>``).
    library : str
        The public implementation: repository or package, and the class.
    method : str
        The refbayes method module, ``refbayes.methods.<method>``.
    derivation : str
        Derivation note and section that state the conversion.
    to_refbayes : callable
        ``from_<name>``: the public keyword arguments -> the refbayes Config.
    from_refbayes : callable
        ``to_<name>``: the refbayes Config -> a dict of the public keyword arguments.
    summary : str
        One line: the conversion in short.
    """
    name: str
    library: str
    method: str
    derivation: str
    to_refbayes: Callable[..., Any]
    from_refbayes: Callable[..., dict]
    summary: str


# ----------------------------------------------------------------------------- registry

def _conv(name, library, method, derivation, summary):
    g = globals()
    return name, Convention(name, library, method, derivation, g[f"from_{name}"],
                            g[f"to_{name}"], summary)


CONVENTIONS: dict[str, Convention] = dict([
    _conv("pytorch_sso_vogn", "cybertronai/pytorch-sso torchsso.optim.VIOptimizer / VOGN", "vogn",
          "derivations/vogn.md#conventions-of-public-implementations",
          "N = dataset_size, tau = kl_weighting, delta = 1/prior_variance, gamma = damping, "
          "beta2 = ema_decay, raw momentum or grad_ema_decay d -> beta1 = 1-d, alpha = lr d"),
    _conv("pytorch_sso_noisy_kfac",
          "cybertronai/pytorch-sso torchsso.optim.VIOptimizer with Kron curvature", "noisy_kfac",
          "derivations/noisy_kfac.md#conventions-of-torchsso-dl-with-bayes-noisy-k-fac",
          "N = dataset_size, eta = prior_variance, kl_weight = kl_weighting, alpha = lr, "
          "beta = ema_decay, gamma_ex = damping, same weight_decay; sampler_damping 'full', "
          "refresh_order 'before'"),
    _conv("emtiyaz_vogn", "emtiyaz/vadam pytorch/vadam/optimizers.py VOGN", "vogn",
          "derivations/vogn.md#conventions-of-public-implementations",
          "delta = prior_prec, alpha = lr, beta2 = 1 - beta, beta1 = gamma = 0, tau = rho = 1"),
    _conv("emtiyaz_vadam", "emtiyaz/vadam pytorch/vadam/optimizers.py Vadam", "vadam",
          "derivations/vadam.md#conventions-of-public-implementations",
          "lam = prior_prec, alpha = lr, (beta1, beta2) = betas; s0 = (prec_init - lam) / N"),
    _conv("emtiyaz_vprop", "emtiyaz/vadam pytorch/vadam/optimizers.py Vprop", "vadam",
          "derivations/vadam.md#conventions-of-public-implementations",
          "vprop_config(N, prior_prec, alpha = lr, beta2 = beta)"),
    _conv("torch_sgd", "torch.optim.SGD (wjmaddox/swa_gaussian's base optimizer)", "swag",
          "derivations/swag.md#conventions-of-the-official-code-wjmaddoxswa_gaussian-at-82c9692",
          "alpha = lr / N, lam = N weight_decay, same momentum"),
    _conv("swa_gaussian", "wjmaddox/swa_gaussian swag.posteriors.SWAG", "swag",
          "derivations/swag.md#conventions-of-the-official-code-wjmaddoxswa_gaussian-at-82c9692",
          "K = max_num_models, same var_clamp, scale = sample_fullrank's scale; z2 times "
          "swa_gaussian_z2_factor(n, K) while n < K"),
    _conv("laplace_torch", "aleximmer/Laplace laplace.Laplace", "laplace",
          "derivations/laplace.md#conventions-of-public-implementations",
          "same prior_precision, structure (full/diag) and subset; curvature from the backend"),
    _conv("slang_bbb", "aaronpmishkin/SLANG BBB baseline (torch.optim.Adam on F_hat / N)", "bbb",
          "derivations/bbb.md#conventions-of-public-implementations",
          "alpha = lr, betas, eps_adam = N eps, lam = prior_prec, kl_weight = 1"),
])
