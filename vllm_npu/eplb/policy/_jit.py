"""numba ``njit`` wrapper that caches compiled kernels when it safely can.

``cache=True`` makes numba write to ``__pycache__`` next to the source (or to
``NUMBA_CACHE_DIR``).  On a read-only install with no writable fallback numba
raises at decoration time, which would break ``import``; in that case we fall
back to an in-memory JIT (slower first call, same results).
"""

from __future__ import annotations

from typing import Any, Callable

from numba import njit as _njit


def njit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit(cache=True)``, or without cache when it cannot be written."""
    try:
        return _njit(cache=True, nogil=True)(fn)
    except (RuntimeError, OSError):
        return _njit(cache=False, nogil=True)(fn)
