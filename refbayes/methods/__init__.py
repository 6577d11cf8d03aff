"""One module per method (README's method table), each keeping the contract written down in
``refbayes.methods._protocol``; ``refbayes.methods.records`` holds one record per driven method.

:class:`Batch`, the minibatch every ``step`` takes, is public here: code outside
``refbayes.methods`` imports it from this package, not from the private ``_estimates``.
"""
from refbayes.methods._estimates import Batch

__all__ = ["Batch"]
