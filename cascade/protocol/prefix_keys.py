"""The keys of a token sequence's prefixes, block by block: the verifier's prefix cache files
blocks of keys and values under them (``cascade.core.kv.prefix_cache``), and the gateway routes a
prompt to the verifier that last served a prefix of it (``gateway.sessions.prefix_routing``).

Key i names the tokens of blocks 0 .. i (``BLOCK_SIZE`` tokens each) *and the scope*: it chains
the previous key with the block's tokens, and the chain's root is the scope (an API key's
identity, or one scope for a single-tenant deployment), so two scopes never share a key.
"""

from __future__ import annotations

import hashlib

BLOCK_SIZE = 64
"""Tokens per block: the verifier's KV block (a multiple of the invariant attention's key
block, so the key span of a sequence's last position never reaches past its last block)."""


def block_keys(tokens: list[int], scope: str, start: int = 0,
               parent: bytes | None = None) -> list[bytes]:
    """The chained keys of the full blocks of ``tokens`` from block ``start`` on (``parent``:
    the key of block ``start - 1``; the chain's root is the scope)."""
    key = parent if start else hashlib.sha256(b"cascade-kv\0" + scope.encode()).digest()
    if key is None:
        raise ValueError(f"prefix keys from block {start}: the key of block {start - 1} is needed")
    keys = []
    for first in range(start * BLOCK_SIZE, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[first : first + BLOCK_SIZE])
        key = hashlib.sha256(key + block).digest()
        keys.append(key)
    return keys
