"""The gateway's configuration: the service's (``lookupspec.service.config``) plus the HTTP side.

``lookupspec serve`` builds it from its flags and environment variables; tests build it directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from lookupspec.service.config import DEFAULT_NAMESPACE, NAME, NAME_PATTERN, Limits, ServiceConfig

__all__ = ["DEFAULT_NAMESPACE", "NAME_PATTERN", "GatewayConfig", "Limits", "parse_api_keys"]


@dataclass(frozen=True)
class GatewayConfig(ServiceConfig):
    """The service's settings (``ServiceConfig``) and the HTTP side:
    api_keys: key -> namespace; empty means no authentication and one ``default_namespace``.
    admin_key: the key that may see the operations detail (``auth``); None: any valid API key.
    drain_timeout_s: on SIGTERM, how long in-flight requests may take before they are cancelled.
    """

    api_keys: Mapping[str, str] = field(default_factory=dict)
    default_namespace: str = DEFAULT_NAMESPACE
    admin_key: str | None = None
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, namespace in self.api_keys.items():
            if not key:
                raise ValueError("API keys must not be empty")
            if not NAME.match(namespace):
                raise ValueError(f"namespace {namespace!r} must match {NAME_PATTERN}")
        if self.admin_key is not None and (not self.admin_key or self.admin_key in self.api_keys):
            raise ValueError("the admin key must be non-empty and differ from every API key")
        if not NAME.match(self.default_namespace):
            raise ValueError(f"namespace {self.default_namespace!r} must match {NAME_PATTERN}")
        if not self.drain_timeout_s >= 0:
            raise ValueError("drain_timeout_s must be >= 0")
        object.__setattr__(self, "api_keys", MappingProxyType(dict(self.api_keys)))

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys)


def parse_api_keys(specs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["KEY:NAMESPACE", ...]`` -> {key: namespace}. The key is everything before the last colon,
    so keys may contain colons; a key given twice with different namespaces is an error."""
    keys: dict[str, str] = {}
    for spec in specs:
        key, sep, namespace = spec.rpartition(":")
        if not sep or not key or not namespace:
            raise ValueError(f"--api-key must be KEY:NAMESPACE, got {spec!r}")
        if not NAME.match(namespace):
            raise ValueError(f"namespace {namespace!r} in --api-key must match {NAME_PATTERN}")
        if keys.get(key, namespace) != namespace:
            raise ValueError("an API key is given twice with different namespaces")
        keys[key] = namespace
    return keys
