"""API keys -> namespaces.

With keys configured (``--api-key KEY:NAMESPACE``), every ``/v1`` request must carry one as
``Authorization: Bearer KEY`` (or ``api-key: KEY``) and runs in that key's namespace; anything else
is a 401 (``middleware.AuthMiddleware`` checks it before anything else). Without keys, every
request runs in the one default namespace. The namespace is the only
thing the routes ever get from here: it scopes every store read and write, which is how one
namespace is kept from seeing or drafting from another's documents and outputs.
"""

from __future__ import annotations

import hmac

from .config import GatewayConfig
from .errors import APIError

__all__ = ["Authenticator"]


class Authenticator:
    def __init__(self, config: GatewayConfig) -> None:
        self._keys = [(key.encode(), ns) for key, ns in config.api_keys.items()]
        self._default = config.default_namespace

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def namespace(self, authorization: str | None, api_key: str | None) -> str:
        """The namespace of the presented key; raises a 401 ``APIError`` when keys are configured
        and none (or a wrong one) was presented."""
        if not self._keys:
            return self._default
        key: str | None = None
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                key = value.strip()
        if key is None and api_key:
            key = api_key.strip()
        if not key:
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        presented = key.encode()
        found = None
        for candidate, ns in self._keys:  # constant time per candidate: no early exit on a match
            if hmac.compare_digest(candidate, presented):
                found = ns
        if found is None:
            raise APIError(401, "invalid API key", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        return found
