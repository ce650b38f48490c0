"""Compiled variants of the Triton kernels: the launch helper every wrapper uses, and a recorder.

Triton compiles one variant per distinct key of a launch: the ``tl.constexpr`` values (modes, block
sizes), the dtypes of pointer arguments and their 16-byte alignment, each specialised integer
argument's class (== 1, divisible by 16) and the launch options (``num_warps``, ...). A variant first
seen in the middle of serving stalls that step for the compile. The kernels therefore mark their
per-step integers (batch size, node counts, positions) ``do_not_specialize``, so that the variants
are their constexprs only, and ``Engine.warmup`` launches every one the engine can reach.

:func:`recording` collects the keys (:func:`variant_key`, computed with Triton's own specialisation
function, so under the interpreter too) of every launch made through :func:`launch` while active: the
tests compare what a warm-up launched with what serving launches afterwards.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["launch", "recording", "variant_key"]

_recorders: list[set] = []


def _dynamic(kernel: Any) -> set:
    """Names and indices of the kernel's ``do_not_specialize`` parameters (compiled or interpreted)."""
    dns = getattr(kernel, "do_not_specialize", None)
    if dns is None:
        dns = getattr(kernel, "kwargs", {}).get("do_not_specialize") or []
    return set(dns)


def variant_key(kernel: Any, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """The key Triton compiles ``kernel[grid](*args, **kwargs)`` under."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = inspect.signature(kernel.fn).parameters
    names = list(params)
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in params))
    dynamic = _dynamic(kernel)
    parts = []
    for i, name in enumerate(names):
        value = bound[name]
        if "constexpr" in str(params[name].annotation):
            parts.append((name, value))
        else:
            specialize = name not in dynamic and i not in dynamic
            parts.append((name, native_specialize_impl(BaseBackend, value, False, specialize, True)))
    return (kernel.fn.__name__, tuple(parts), options)


def launch(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, noting its variant for active recorders."""
    if _recorders:
        key = variant_key(kernel, args, kwargs)
        for rec in _recorders:
            rec.add(key)
    kernel[grid](*args, **kwargs)


@contextmanager
def recording() -> Iterator[set]:
    """The set of variant keys launched while the context is active."""
    seen: set = set()
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.remove(seen)
