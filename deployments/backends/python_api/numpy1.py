"""NumPy 1's names that NumPy 2 removed, for ``model.py`` files written for Triton 2.51's Python backend.

That release's stub runs models on NumPy 1, so a model written for it may use NumPy 1's constant and
scalar-type aliases (``np.NINF``, ``np.float_`` ...); this server's environment has NumPy 2, where
each of those raises ``AttributeError``. :func:`restore` puts back those aliases, each the value it
named in NumPy 1, before a Python model is imported. Functions NumPy 2 removed or changed are not
restored: such a model needs its code updated, or the server's environment pinned to ``numpy<2``.
"""

from __future__ import annotations

import numpy as np

# name -> the value NumPy 1 gave it (NumPy 2.0's migration guide lists each as removed)
REMOVED_ALIASES: dict[str, object] = {
    "NINF": -np.inf,
    "PINF": np.inf,
    "NZERO": -0.0,
    "PZERO": 0.0,
    "Inf": np.inf,
    "Infinity": np.inf,
    "infty": np.inf,
    "NaN": np.nan,
    "float_": np.float64,
    "complex_": np.complex128,
    "cfloat": np.complex128,
    "singlecomplex": np.complex64,
    "longfloat": np.longdouble,
    "longcomplex": np.clongdouble,
    "clongfloat": np.clongdouble,
    "string_": np.bytes_,
    "unicode_": np.str_,
}


def restore() -> list[str]:
    """Put back every alias of :data:`REMOVED_ALIASES` this NumPy lacks; returns their names (none on
    NumPy 1, where each is still there)."""
    restored = [name for name in REMOVED_ALIASES if name not in np.__dict__]
    for name in restored:
        setattr(np, name, REMOVED_ALIASES[name])
    return restored
