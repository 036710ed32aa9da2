"""KV memory for many sequences: one preallocated store of fixed-size blocks, a block table per
sequence.

Layout: per layer, keys and values are ``[kv_heads, blocks * BLOCK_SIZE, head_dim]``; block b
holds store slots ``b * BLOCK_SIZE ..``. A sequence's ``BlockTable`` lists its blocks in order,
so its position p lives in slot ``table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE``. A
sequence holds blocks for the positions it has (memory follows its actual length, not its
``max_tokens``); blocks past its length (rejected drafts, tree nodes) go back at its next pass.
A growing table takes the block after its last one when that is free, so most tables are one
run of slots and attention reads them as a view.

Blocks are reference-counted: a block several sequences begin with (a shared prompt) is held
once. A block whose tokens are final can be *registered* under a key (the prefix cache's chained
hash, ``cascade.core.kv.prefix_cache``); when its last holder lets go it stays filled, evictable,
and a later sequence with the same key takes it instead of computing it. Allocation takes free
blocks first (lowest id after the preferred one), then evicts registered ones least recently
released first. A registered or shared block is never written: a writer copies it first.

The store is allocated with ``torch.empty``: the operating system commits pages only as
sequences write them, so an idle verifier with a large budget stays small.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from cascade.protocol.prefix_keys import BLOCK_SIZE


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
        """The shape of ``model``'s entries (of this rank's heads, for a tensor-parallel
        slice: ``cascade.core.model.tensor_parallel``)."""
        _, kv_heads, head_dim = attention_heads(model.config)
        shard = getattr(model, "cascade_shard", None)
        kv_heads //= shard.world if shard else 1
        return cls(model.config.num_hidden_layers, kv_heads, head_dim,
                   next(model.parameters()).dtype)

    @property
    def bytes_per_token(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element


def blocks_for(positions: int) -> int:
    """Blocks that hold ``positions`` positions."""
    return -(-positions // BLOCK_SIZE)


class BlockTable:
    """A sequence's blocks, in position order."""

    def __init__(self) -> None:
        self.blocks: list[int] = []

    def __len__(self) -> int:
        return len(self.blocks)

    def slot(self, position: int) -> int:
        return self.blocks[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE

    def slots(self, first: int, end: int) -> list[int]:
        """The store slots of positions ``first .. end - 1``: a range per block (a step builds
        many; the caller makes one tensor of them all)."""
        out: list[int] = []
        for index in range(first // BLOCK_SIZE, (end - 1) // BLOCK_SIZE + 1 if end > first else 0):
            start = index * BLOCK_SIZE
            base = self.blocks[index] * BLOCK_SIZE - start
            out.extend(range(base + max(first, start), base + min(end, start + BLOCK_SIZE)))
        return out

    def run_start(self, first: int, end: int) -> int | None:
        """The first store slot of positions ``first .. end - 1`` when they are one run of
        slots (their keys are then a view of the store), else None."""
        if end <= first:
            return None
        low, high = first // BLOCK_SIZE, (end - 1) // BLOCK_SIZE
        run = self.blocks[low : high + 1]
        if run != list(range(run[0], run[0] + len(run))):
            return None
        return self.slot(first)


class KVStore:
    """Keys and values of every sequence, and the allocator of their blocks."""

    def __init__(self, shape: KVShape, capacity: int, device: torch.device | str = "cpu",
                 zero_values: bool = False) -> None:
        """``capacity``: positions (rounded down to whole blocks, at least one).
        ``zero_values``: a block's values are zeroed before its first use (the invariant
        attention multiplies masked entries by zero weights, so they must be finite)."""
        if capacity < 1:
            raise ValueError(f"KV budget must be at least one token, got {capacity}")
        self.shape = shape
        self.num_blocks = max(1, capacity // BLOCK_SIZE)
        self.capacity = self.num_blocks * BLOCK_SIZE
        dims = (shape.num_layers, shape.num_kv_heads, self.capacity, shape.head_dim)
        self.keys = torch.empty(dims, dtype=shape.dtype, device=device)
        self.values = torch.empty(dims, dtype=shape.dtype, device=device)
        self.zero_values = zero_values
        self.mirror = None
        """Where each change to the contents is sent first (``cascade.core.parallel.ranks``: the twin
        stores of a tensor-parallel target's other ranks); None: nowhere."""
        self._untouched = set(range(self.num_blocks))
        self._free = list(range(self.num_blocks))  # a heap; may hold ids taken meanwhile
        self._is_free = [True] * self.num_blocks
        self._num_free = self.num_blocks
        self._refs = [0] * self.num_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """Registered blocks nobody holds, least recently released first."""
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._lock = threading.Lock()

    @property
    def available(self) -> int:
        """Blocks a sequence can take now (free, or registered and held by nobody)."""
        return self.num_blocks - self.held

    @property
    def held(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self._num_free - len(self._evictable)

    @property
    def cached(self) -> int:
        """Registered blocks nobody holds (the prefix cache's, evictable)."""
        return len(self._evictable)

    @property
    def usage(self) -> float:
        """Held share of the store, 0..1 (cached blocks nobody holds count as free)."""
        return self.held / self.num_blocks

    @property
    def reserved(self) -> int:
        """Positions in blocks some sequence holds."""
        return self.held * BLOCK_SIZE

    def allocate(self, after: int | None = None) -> int | None:
        """A block for new entries (held once), the one after ``after`` when it is free; None
        when every block is held."""
        with self._lock:
            block = self._take_free(after)
            if block is None and self._evictable:
                block, _ = self._evictable.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
            if block is None:
                return None
            self._refs[block] = 1
        self.touch((block,))
        return block

    def touch(self, blocks) -> None:
        """Blocks about to be used: zero the values of those not used before (``zero_values``)."""
        for block in blocks:
            if self.zero_values and block in self._untouched:
                self.values[:, :, block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE].zero_()
            self._untouched.discard(block)

    def _take_free(self, after: int | None) -> int | None:
        if after is not None and after + 1 < self.num_blocks and self._is_free[after + 1]:
            block = after + 1
        else:
            while self._free and not self._is_free[self._free[0]]:
                heapq.heappop(self._free)
            if not self._free:
                return None
            block = heapq.heappop(self._free)
        self._is_free[block] = False
        self._num_free -= 1
        return block

    def grow(self, table: BlockTable, count: int) -> bool:
        """Add blocks to ``table`` until it has ``count``, each after its last one when that is
        free; False when the store runs out first (the blocks taken stay in the table)."""
        while len(table) < count:
            block = self.allocate(table.blocks[-1] if table.blocks else None)
            if block is None:
                return False
            table.blocks.append(block)
        return True

    def new_table(self, positions: int) -> BlockTable:
        """A table with blocks for ``positions`` positions (a run of blocks when free), or
        ValueError when the store has too few."""
        table = BlockTable()
        if not self.grow(table, blocks_for(positions)):
            for taken in table.blocks:
                self.release(taken)
            raise ValueError(f"the KV store has no room for {positions} positions")
        return table

    def hold(self, block: int) -> None:
        """One more holder of ``block`` (a shared or cached prefix)."""
        with self._lock:
            self._refs[block] += 1
            self._evictable.pop(block, None)

    def release(self, block: int) -> None:
        """One holder fewer; a block nobody holds becomes evictable (registered) or free."""
        with self._lock:
            self._refs[block] -= 1
            if self._refs[block] > 0:
                return
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._is_free[block] = True
                self._num_free += 1
                heapq.heappush(self._free, block)

    def register(self, block: int, key: bytes) -> None:
        """``block`` holds the final entries of the prefix ``key`` names (the first block
        registered under a key keeps it)."""
        with self._lock:
            if block not in self._key_of and key not in self._block_of:
                self._key_of[block], self._block_of[key] = key, block

    def lookup(self, key: bytes) -> int | None:
        with self._lock:
            return self._block_of.get(key)

    def is_shared(self, block: int) -> bool:
        """Whether writing ``block`` would change what another holder or the cache holds."""
        return self._refs[block] > 1 or block in self._key_of

    def copy_block(self, source: int, target: int, count: int = BLOCK_SIZE) -> None:
        """The first ``count`` slots of block ``source`` into block ``target`` (every layer)."""
        src, dst = source * BLOCK_SIZE, target * BLOCK_SIZE
        with self.changing("copy_block", source, target, count):
            self.touch((target,))
            for store in (self.keys, self.values):
                store[:, :, dst : dst + count] = store[:, :, src : src + count]

    def move(self, table: BlockTable, sources: list[int], targets: list[int]) -> None:
        """Copy the entries of positions ``sources`` of ``table`` to positions ``targets`` (every
        layer; the sources are read before anything is written)."""
        self.move_slots([table.slot(p) for p in sources], [table.slot(p) for p in targets])

    def move_slots(self, sources: list[int], targets: list[int]) -> None:
        """Copy the entries of store slots ``sources`` to ``targets`` (every layer)."""
        with self.changing("move_slots", sources, targets):
            src = torch.tensor(sources, device=self.keys.device)
            dst = torch.tensor(targets, device=self.keys.device)
            self.keys[:, :, dst] = self.keys[:, :, src]
            self.values[:, :, dst] = self.values[:, :, src]

    def randomize(self) -> None:
        """Fill the whole store with random values (timing passes: no uninitialised memory,
        whose denormals or NaN would be slow)."""
        with self.changing("randomize"):
            self.keys.normal_()
            self.values.normal_()

    def changing(self, operation: str, *args):
        """The context of one change to the contents: sent to ``mirror`` first, when set."""
        if self.mirror is None:
            return contextlib.nullcontext()
        return self.mirror.change(operation, *args)
