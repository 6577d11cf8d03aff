"""``cupyx.scipy`` of the stand-in (linalg and special modelled; sparse is a stub)."""
from cupy import get_array_module, _stub_module
from cupyx.scipy import linalg, special

sparse = _stub_module("cupyx.scipy.sparse")
