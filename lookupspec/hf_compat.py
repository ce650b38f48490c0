"""What differs between the transformers 5.x releases lookupspec supports (``transformers>=5.0,<6``).

transformers 5.24 renamed the KV-cache argument of every model's ``forward`` from
``past_key_values`` to ``cache`` and warns (``FutureWarning``) on the old name until 5.40 removes it;
earlier 5.x releases take only ``past_key_values``. :func:`with_cache` gives the keyword arguments
for the release installed, read from the model's own signature (once per model class).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["cache_keyword", "with_cache"]


@functools.cache
def _keyword(cls: Any) -> str:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_keyword(model: Any) -> str:
    """``"cache"`` where ``model.forward`` takes it (transformers >= 5.24), else ``"past_key_values"``."""
    cls: Any = type(model)
    return _keyword(cls)


def with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(**inputs, **with_cache(model, cache))``."""
    return {cache_keyword(model): cache}
