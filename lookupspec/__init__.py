"""lookupspec: speculative decoding with lookup drafts and exact verification."""

from __future__ import annotations

import os

# No code path may fetch weights from a model hub: make every huggingface_hub call offline before
# transformers is imported anywhere in this process. A user can still opt out explicitly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"

# after the environment above, before any subpackage is imported
from pathlib import Path as _Path

from lookupspec import _checkout

_checkout.install(_Path(__file__).absolute().parent)

__all__ = ["__version__"]
