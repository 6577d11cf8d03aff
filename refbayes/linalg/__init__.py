"""Structured Gaussian algebra: low-rank-plus-diagonal precisions (``lowrank``), Kronecker
factors (``kron``) and Gaussian densities, KL divergences and log-determinants (``gaussian``)."""
from refbayes.linalg import gaussian, kron, lowrank

__all__ = ["gaussian", "kron", "lowrank"]
