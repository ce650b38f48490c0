"""lookupspec: speculative decoding with lookup drafts and exact verification.

The public surface, imported lazily (``import lookupspec`` loads neither torch nor transformers)::

    import lookupspec
    client = lookupspec.connect("smollm2-135m-instruct")        # in-process, or "http://host:port"
    result = client.generate(lookupspec.GenerationRequest(prompt="Hello", max_tokens=16))

Importing the package changes no environment variable and installs no import hook; model loading
never contacts a hub (``lookupspec.models`` loads with ``local_files_only``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "connect": "lookupspec.client",
    "Client": "lookupspec.client",
    "ClientError": "lookupspec.requests",
    "GenerationRequest": "lookupspec.requests",
    "Lookup": "lookupspec.requests",
    "Delta": "lookupspec.client",
    "Result": "lookupspec.client",
    "TextEngine": "lookupspec.text",
    "GenerationParams": "lookupspec.params",
    "SpecParams": "lookupspec.params",
    "LookupScope": "lookupspec.params",
    "Service": "lookupspec.service",
    "ServiceConfig": "lookupspec.service",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lookupspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
