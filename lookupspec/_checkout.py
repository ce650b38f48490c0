"""Run from a source checkout, ``lookupspec.gateway`` and ``lookupspec.kernels`` come from that checkout.

pyproject installs the root's ``gateway/`` and ``kernels/`` as subpackages of ``lookupspec``. An
editable install does so with a finder that maps them to the checkout it was made from, wherever
``lookupspec`` itself is imported from. So a second checkout reached through ``PYTHONPATH`` (how
``lookupspec bench-serve`` compares two commits, see ``benchmarks/server_process.py``) ran its own
``lookupspec`` beside the first checkout's gateway and kernels. :func:`install` puts a finder ahead
of that one: when the ``lookupspec`` package sits in a checkout (a ``pyproject.toml`` beside it and
the two directories there), the two subpackages are that checkout's. An installed wheel (the
subpackages inside ``lookupspec/``) is left alone.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

__all__ = ["install"]

_SUBPACKAGES = ("gateway", "kernels")


class _CheckoutFinder:
    """A meta path finder for ``lookupspec.gateway`` and ``lookupspec.kernels`` only; their own
    submodules are then found through the package's ``__path__``."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        d = self.dirs.get(fullname)
        if d is None:
            return None
        return importlib.util.spec_from_file_location(fullname, d / "__init__.py",
                                                      submodule_search_locations=[str(d)])


def install(package_dir: Path) -> None:
    """Map the subpackages to ``package_dir``'s checkout (no-op outside a checkout, or if done)."""
    root = package_dir.parent
    if (package_dir / "gateway").is_dir() or not (root / "pyproject.toml").is_file():
        return
    dirs = {f"lookupspec.{name}": root / name for name in _SUBPACKAGES
            if (root / name / "__init__.py").is_file()}
    if dirs and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(dirs))
