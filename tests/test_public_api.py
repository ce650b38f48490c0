"""`import lookupspec`: the exported names, and an import that leaves the host process alone."""

from __future__ import annotations

import json
import subprocess
import sys

import lookupspec


def test_every_exported_name_resolves_and_is_listed_in_all():
    for name in lookupspec.__all__:
        assert getattr(lookupspec, name) is not None, name
    assert {"connect", "Client", "GenerationRequest", "TextEngine", "SpecParams"} <= set(lookupspec.__all__)


def test_an_unknown_name_is_an_attribute_error():
    try:
        lookupspec.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("lookupspec.no_such_name resolved")


def test_importing_lookupspec_changes_no_environment_variable_hook_or_heavy_module():
    probe = (
        "import json, os, sys; before = dict(os.environ); hooks = list(sys.meta_path); "
        "import lookupspec; "
        "print(json.dumps({'env': dict(os.environ) == before, 'hooks': sys.meta_path == hooks, "
        "'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"env": True, "hooks": True, "torch": False, "transformers": False}
