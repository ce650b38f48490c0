"""Packaging contract: every package directory is listed in pyproject, the root sub-packages install
under lookupspec.*, and the CLI answers --help."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for dotted, rel in mapping.items():
        for init in (ROOT / rel).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / rel).parts
            found.add(".".join((dotted, *parts)) if parts else dotted)
    # a mapped sub-package of lookupspec is also found under lookupspec/ only if it exists there
    assert found == listed, f"missing from pyproject: {found - listed}; stale: {listed - found}"


def test_root_subpackages_import_under_lookupspec():
    import lookupspec.gateway
    import lookupspec.kernels

    assert Path(lookupspec.kernels.__file__).parent == ROOT / "kernels"
    assert Path(lookupspec.gateway.__file__).parent == ROOT / "gateway"


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "lookupspec.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for cmd in ("serve", "generate", "pull", "bench"):
        assert cmd in out


def test_the_c_kernels_sources_ship_with_the_package():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    from fnmatch import fnmatch

    from lookupspec.runtime.native import attention, layer_ops, matmul

    patterns = cfg["package-data"]["lookupspec.runtime.native"]
    for source in (matmul._SOURCE, attention._SOURCE, layer_ops._SOURCE, matmul._SOURCE.with_name("simd.h")):
        assert source.is_file()
        assert any(fnmatch(source.name, pattern) for pattern in patterns)
