"""Prefix affinity: a prompt goes to the verifier (and the drafter) that last served a prefix of
it, while that pod is not much busier than the least-loaded one of its role.

A verifier keeps the KV blocks of ended sequences (``cascade.core.kv.prefix_cache``), and a drafter
its ended caches (``cascade.core.kv.prefix_share.EndedCaches``), so the next turn of a chat or the
next step of an agent loop prefills only what is new, *on those pods*. Every gateway records,
in Redis, which pod of each role each block-prefix of a prompt went to (the keys are the
verifier's own chained block keys, ``cascade.protocol.prefix_keys``, so they carry the tenant
scope too), with a time to live; a new prompt looks up all its block keys in one round trip
and takes the pod of the longest one found, unless that pod is not live, is excluded, or
carries more than ``slack`` sessions over the least-loaded live one of its role: then load
decides, as without affinity.
"""

from __future__ import annotations

import logging

import redis.asyncio as redis

from cascade.protocol.prefix_keys import block_keys
from cascade.serving.registry import as_text, live_pods

log = logging.getLogger(__name__)

KEY_PREFIX = "cascade:prefix:"
DEFAULT_TTL_S = 600
"""How long a prefix's verifier is remembered after its last use (an idle verifier evicts
cached blocks only when it needs the memory, so this is an estimate, not a promise)."""
DEFAULT_SLACK = 4
"""Sessions a prefix's verifier may carry over the least-loaded one and still be picked."""


class PrefixRouter:
    def __init__(self, client: redis.Redis, ttl_s: int = DEFAULT_TTL_S,
                 slack: int = DEFAULT_SLACK) -> None:
        self.client, self.ttl_s, self.slack = client, ttl_s, slack

    @staticmethod
    def keys(role: str, tokens: list[int], scope: str) -> list[str]:
        return [f"{KEY_PREFIX}{role}:{key.hex()}" for key in block_keys(tokens, scope)]

    async def pick(self, role: str, tokens: list[int], scope: str, exclude: set[str]
                   ) -> str | None:
        """The pod of ``role`` holding the longest remembered prefix of ``tokens`` when its
        load allows, else None (the caller picks by load). A Redis error is None too."""
        keys = self.keys(role, tokens, scope)
        if not keys:
            return None
        try:
            found = await self.client.mget(keys)
            pods = {p.address: p.load for p in await live_pods(self.client, role)
                    if p.address not in exclude}
        except redis.RedisError as exc:
            log.warning("prefix affinity skipped: %s", exc)
            return None
        if not pods:
            return None
        lowest = min(pods.values())
        for raw in reversed(found):
            address = None if raw is None else as_text(raw)  # None: no pod remembered
            if address in pods and pods[address] <= lowest + self.slack:
                return address
        return None

    async def served(self, tokens: list[int], scope: str, verifier: str,
                     drafter: str | None = None) -> None:
        """Remember that the pods now hold the prefixes of ``tokens`` (best effort)."""
        pods = {role: pod for role, pod in (("verifier", verifier), ("drafter", drafter)) if pod}
        keys = {role: self.keys(role, tokens, scope) for role in pods}
        if not keys["verifier"]:
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for role, names in keys.items():
                    for key in names:
                        pipe.set(key, pods[role], ex=self.ttl_s)
                await pipe.execute()
        except redis.RedisError as exc:
            log.warning("prefix affinity not recorded: %s", exc)
