"""``cupyx.scipy.special`` of the stand-in: SciPy's special functions of the same names."""
import scipy.special as _sps

from cupy._standin import PINNED as _PINNED, lift as _lift, not_modelled as _not_modelled

for _name in _PINNED["names"]["cupyx.scipy.special"]:
    _f = getattr(_sps, _name, None)
    globals()[_name] = (_lift(_f, _name) if _f is not None
                        else _not_modelled(f"cupyx.scipy.special.{_name}"))
del _name, _f
