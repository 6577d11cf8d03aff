"""``cupy.random`` of the stand-in: NumPy's streams (not cuRAND's) returning device arrays."""
import numpy as _np

from cupy._standin import PINNED as _PINNED, lift as _lift, not_modelled as _not_modelled


class _Generator:
    """``cupy.random.Generator`` over a NumPy Generator: the same draws, as device arrays."""

    def __init__(self, bit_generator=None):
        self._g = _np.random.default_rng(bit_generator)

    def __getattr__(self, name):
        return _lift(getattr(self._g, name), f"Generator.{name}")


def default_rng(seed=None):
    return _Generator(seed)


class RandomState:
    def __init__(self, seed=None):
        self._r = _np.random.RandomState(seed)

    def __getattr__(self, name):
        return _lift(getattr(self._r, name), f"RandomState.{name}")


_SPECIAL = {"default_rng": default_rng, "RandomState": RandomState}
for _name in _PINNED["names"]["cupy.random"]:
    if _name in _SPECIAL:
        globals()[_name] = _SPECIAL[_name]
    elif callable(getattr(_np.random, _name, None)) and \
            not isinstance(getattr(_np.random, _name), type):
        globals()[_name] = _lift(getattr(_np.random, _name), _name)
    else:
        globals()[_name] = _not_modelled(f"cupy.random.{_name}")
del _name
