"""API keys at the edge: ``Authorization: Bearer <key>`` on every route but the public ones
(probes, metrics, the playground page; the page's own API calls send the key).

Keys are compared by SHA-256 digest with ``secrets.compare_digest``; no keys configured means no
check (local use). The same check guards the gRPC Generate stream (metadata ``authorization``).

A key's *identity* (``ApiKeys.identity``) is a digest of it, never the key: sessions store it
(only the key that started a session may resume it) and the per-key limits count by it. With
keys off every client is the same one, ``anonymous``: what a bearer string says means nothing
there, so it cannot buy a limit bucket of its own.
"""

from __future__ import annotations

import hashlib
import secrets

from fastapi import FastAPI, Request

from gateway.openai.errors import APIError, error_response
from gateway.playground import is_playground

PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics", "/version"})
ANONYMOUS = "anonymous"


class ApiKeys:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys if k]

    @property
    def is_enabled(self) -> bool:
        return bool(self._digests)

    def identity(self, authorization: str | None) -> str:
        """The caller's key identity: a digest of its bearer token (``anonymous`` with keys
        off). Call after ``allows``."""
        if not self.is_enabled:
            return ANONYMOUS
        _, _, token = (authorization or "").partition(" ")
        return hashlib.sha256(token.strip().encode()).hexdigest()[:32]

    def allows(self, authorization: str | None) -> bool:
        if not self.is_enabled:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        digest = hashlib.sha256(token.strip().encode()).digest()
        return any(secrets.compare_digest(digest, known) for known in self._digests)


def invalid_key() -> APIError:
    return APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def install_api_keys(app: FastAPI, keys: ApiKeys) -> None:
    if not keys.is_enabled:
        return

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        path = request.url.path
        public = path in PUBLIC_PATHS or is_playground(path)
        if public or keys.allows(request.headers.get("authorization")):
            return await call_next(request)
        return error_response(invalid_key())
