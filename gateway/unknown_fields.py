"""Logging the request fields the API does not know, with bounded memory and log volume.

Unknown fields are accepted (clients send vendor extensions) and logged so an operator sees what
clients ask for. A request may carry any number of them, so both costs are capped: one log line per
request listing at most ``max_listed`` names of at most ``max_name_chars`` characters each (plus how
many more there were), at WARNING the first time a name is seen and at DEBUG after that; and at most
``max_remembered`` names are remembered process-wide. Once that many are remembered, new names are
logged at DEBUG too (a client inventing names cannot fill the log at WARNING level, nor memory).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Collection

__all__ = ["UnknownFields"]

log = logging.getLogger(__name__)


class UnknownFields:
    def __init__(self, *, max_remembered: int = 256, max_listed: int = 8, max_name_chars: int = 64) -> None:
        self.max_remembered = max_remembered
        self.max_listed = max_listed
        self.max_name_chars = max_name_chars
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    @property
    def remembered(self) -> int:
        return len(self._seen)

    def _short(self, name: str) -> str:
        return name if len(name) <= self.max_name_chars else name[: self.max_name_chars - 3] + "..."

    def observe(self, names: Collection[str]) -> None:
        """Log one request's unknown field names (see the module docstring)."""
        if not names:
            return
        listed = sorted(self._short(n) for n in itertools.islice(names, self.max_listed))
        with self._lock:
            room = self.max_remembered - len(self._seen)
            new = [n for n in listed if n not in self._seen][: max(room, 0)]
            self._seen.update(new)
            now_full = bool(new) and len(self._seen) >= self.max_remembered
        more = f" (and {len(names) - len(listed)} more)" if len(names) > len(listed) else ""
        (log.warning if new else log.debug)("ignoring unknown request fields: %s%s", ", ".join(listed), more)
        if now_full:
            log.warning("remembered %d unknown field names; from now on new ones are logged at debug level",
                        self.max_remembered)
