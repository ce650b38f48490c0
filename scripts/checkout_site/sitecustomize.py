"""Run a bare checkout without installing it: ``lookupspec.kernels`` and ``lookupspec.gateway`` from
the checkout's ``kernels/`` and ``gateway/`` (pyproject's package-dir mapping), for the GPU machine,
which gets the repository tree without its ``.venv``.

``scripts/gpu-check.sh`` puts this folder and the checkout's root on ``PYTHONPATH``, so that every
Python process it starts (pytest's too) imports this file at start-up (``sitecustomize``). The finder
goes last on ``sys.meta_path``: an installed lookupspec (an editable install, as in ``.venv``) is
found first and this one changes nothing. A ``sitecustomize`` further down the path (an image's own)
still runs, after this one.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import runpy
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
_MAPPED = {"lookupspec.kernels": _ROOT / "kernels", "lookupspec.gateway": _ROOT / "gateway"}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds the mapped packages in the checkout (and nothing else)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        folder = _MAPPED.get(name)
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def install() -> None:
    if not any(isinstance(f, CheckoutFinder) or type(f).__name__ == "CheckoutFinder" for f in sys.meta_path):
        sys.meta_path.append(CheckoutFinder())


def _chain() -> None:
    """Run the ``sitecustomize`` this file shadows (a distribution's or an image's), if any."""
    here = Path(__file__).resolve().parent
    for entry in sys.path:
        try:
            folder = Path(entry or ".").resolve()
        except OSError:
            continue
        if folder != here and (folder / "sitecustomize.py").is_file():
            runpy.run_path(str(folder / "sitecustomize.py"), run_name="sitecustomize")
            return


install()
if __name__ == "sitecustomize":  # imported at start-up, not run by scripts/gpu_check.py
    _chain()
