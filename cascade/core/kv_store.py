"""KV memory for many sequences: one preallocated store, one contiguous region per sequence.

Layout: per layer, keys and values are ``[kv_heads, capacity, head_dim]``; a sequence owns the
positions ``region.start .. region.start + region.size - 1`` of that middle axis, so its cached
keys are a *view* of the store (no gather before attention) and forgetting rejected positions is
only a shorter length (nothing is copied). A region is sized for the sequence's whole life
(prompt plus ``max_new_tokens``) when the sequence is admitted, so a running sequence never runs
out of memory and nothing has to be preempted; the price is that admission counts the worst
case. Free space is a sorted list of holes, allocated first-fit and merged on release.

The store is allocated with ``torch.empty``: the operating system commits pages only as
sequences write them, so an idle verifier with a large budget stays small.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MEMORY_FRACTION = 0.4
"""Share of the memory available at start-up that the default budget may use."""


@dataclass(frozen=True)
class Region:
    start: int
    size: int


def attention_heads(config) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) of a transformers model config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(config, "head_dim", None) or config.hidden_size // heads


@dataclass(frozen=True)
class KVShape:
    """What one cached position holds, per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model) -> KVShape:
        _, kv_heads, head_dim = attention_heads(model.config)
        return cls(model.config.num_hidden_layers, kv_heads, head_dim,
                   next(model.parameters()).dtype)

    @property
    def bytes_per_token(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


def available_memory(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes this process can still use: the machine's available memory, or less when a
    container's memory limit (cgroup v2 or v1) leaves less."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit():
            available = min(available, max(0, int(limit) - usage))
        break
    return available


def default_budget(shape: KVShape, max_length: int) -> int:
    """Tokens the store holds by default: 64 full-length sequences, at most
    ``DEFAULT_MEMORY_FRACTION`` of the memory available now (container limits included)."""
    budget = int(available_memory() * DEFAULT_MEMORY_FRACTION) // shape.bytes_per_token
    return max(max_length, min(64 * max_length, budget))


class KVStore:
    """Keys and values of every admitted sequence, and the allocator of their regions."""

    def __init__(self, shape: KVShape, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"KV budget must be at least one token, got {capacity}")
        self.shape, self.capacity = shape, capacity
        dims = (shape.num_layers, shape.num_kv_heads, capacity, shape.head_dim)
        self.keys = torch.empty(dims, dtype=shape.dtype, device=device)
        self.values = torch.empty(dims, dtype=shape.dtype, device=device)
        self._holes: list[tuple[int, int]] = [(0, capacity)]  # (start, size), by start
        self._lock = threading.Lock()
        self.reserved = 0

    @property
    def usage(self) -> float:
        """Reserved share of the store, 0..1."""
        return self.reserved / self.capacity

    def reserve(self, size: int) -> Region | None:
        """A region of ``size`` positions, or None when no hole is large enough."""
        if size < 1:
            raise ValueError(f"a region needs at least one position, got {size}")
        with self._lock:
            for i, (start, hole) in enumerate(self._holes):
                if hole >= size:
                    if hole == size:
                        del self._holes[i]
                    else:
                        self._holes[i] = (start + size, hole - size)
                    self.reserved += size
                    return Region(start, size)
        return None

    def release(self, region: Region) -> None:
        with self._lock:
            i = bisect.bisect(self._holes, (region.start, region.size))
            self._holes.insert(i, (region.start, region.size))
            self.reserved -= region.size
            self._merge_around(i)

    def _merge_around(self, i: int) -> None:
        if i + 1 < len(self._holes) and sum(self._holes[i]) == self._holes[i + 1][0]:
            self._holes[i] = (self._holes[i][0], self._holes[i][1] + self._holes[i + 1][1])
            del self._holes[i + 1]
        if i > 0 and sum(self._holes[i - 1]) == self._holes[i][0]:
            self._holes[i - 1] = (self._holes[i - 1][0],
                                  self._holes[i - 1][1] + self._holes[i][1])
            del self._holes[i]

    def move(self, region: Region, sources: list[int], targets: list[int]) -> None:
        """Copy the entries of slots ``sources`` of ``region`` to slots ``targets`` (every
        layer; the sources are read before anything is written)."""
        src = torch.tensor(sources, device=self.keys.device) + region.start
        dst = torch.tensor(targets, device=self.keys.device) + region.start
        self.keys[:, :, dst] = self.keys[:, :, src]
        self.values[:, :, dst] = self.values[:, :, src]

    def copy(self, source: Region, target: Region, count: int) -> None:
        """Copy the first ``count`` slots of ``source`` to the first of ``target`` (every
        layer): a shared prompt prefix computed once (``cascade.core.prefix_share``)."""
        if count > min(source.size, target.size):
            raise ValueError(f"cannot copy {count} slots between regions of {source.size} "
                             f"and {target.size}")
        for store in (self.keys, self.values):
            store[:, :, target.start : target.start + count] = \
                store[:, :, source.start : source.start + count]

    def largest_hole(self) -> int:
        with self._lock:
            return max((size for _, size in self._holes), default=0)
