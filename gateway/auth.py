"""API keys -> namespaces, and who may see the operations detail.

With keys configured (``--api-key KEY:NAMESPACE``), every ``/v1`` request must carry one as
``Authorization: Bearer KEY`` (or ``api-key: KEY``) and runs in that key's namespace; anything else
is a 401 (``middleware.AuthMiddleware`` checks it before anything else). Without keys, every
request runs in the one default namespace. The namespace is the only
thing the routes ever get from here: it scopes every store read and write, which is how one
namespace is kept from seeing or drafting from another's documents and outputs.

Operations detail (``/health`` beyond its status, ``/health?digest=true``) describes the whole
replica: the data directory, store-wide counts, a hash over every namespace's state. With keys
configured it needs a key: the admin key (``--admin-key``) when one is set, otherwise any valid API
key. Without API keys and without an admin key (a development setup) it is open, as everything
else is; an admin key alone protects just the detail.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from .config import DEFAULT_NAMESPACE, GatewayConfig
from .errors import APIError

__all__ = ["Authenticator"]


def _presented(authorization: str | None, api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if api_key and api_key.strip():
        return api_key.strip()
    return None


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class Authenticator:
    def __init__(self, api_keys: Mapping[str, str], *, default_namespace: str = DEFAULT_NAMESPACE,
                 admin_key: str | None = None) -> None:
        self._keys = [(key.encode(), ns) for key, ns in api_keys.items()]
        self._default = default_namespace
        self._admin = admin_key.encode() if admin_key else None

    @classmethod
    def from_config(cls, config: GatewayConfig) -> Authenticator:
        return cls(config.api_keys, default_namespace=config.default_namespace, admin_key=config.admin_key)

    @property
    def default_namespace(self) -> str:
        """The namespace of every caller when no API keys are configured."""
        return self._default

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def _match(self, presented: bytes) -> str | None:
        found = None
        for candidate, ns in self._keys:  # constant time per candidate: no early exit on a match
            if hmac.compare_digest(candidate, presented):
                found = ns
        return found

    def namespace(self, authorization: str | None, api_key: str | None) -> str:
        """The namespace of the presented key; raises a 401 ``APIError`` when keys are configured
        and none (or a wrong one) was presented."""
        if not self._keys:
            return self._default
        key = _presented(authorization, api_key)
        if not key:
            raise _unauthorized("missing API key: send 'Authorization: Bearer KEY'")
        found = self._match(key.encode())
        if found is None:
            raise _unauthorized("invalid API key")
        return found

    def may_see_detail(self, authorization: str | None, api_key: str | None) -> bool:
        """Whether these credentials may see the operations detail (module docstring). A key that
        is presented but wrong is a 401, as on ``/v1``; no key at all is simply no detail."""
        if not self._keys and self._admin is None:
            return True
        key = _presented(authorization, api_key)
        if not key:
            return False
        presented = key.encode()
        if self._admin is not None and hmac.compare_digest(self._admin, presented):
            return True
        if self._match(presented) is None:
            raise _unauthorized("invalid API key")
        return self._admin is None  # with an admin key, a tenant's key sees no replica-wide detail
