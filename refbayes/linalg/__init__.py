"""Structured Gaussian algebra: low-rank-plus-diagonal precisions (``lowrank``), Kronecker
factors (``kron``) and Gaussian densities, KL divergences and log-determinants (``gaussian``)."""
from refbayes.linalg import lowrank

__all__ = ["lowrank"]
