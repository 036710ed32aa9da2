"""The ranks of a tensor-parallel target: rank 0 schedules, the others follow.

Rank 0 is the verifier itself: it runs the engine, the scheduler and the server, and holds all
the bookkeeping (which block is free, whose table holds what, admission, prefix keys). Every
change it makes to a KV store's contents — a pass, a block copied, entries moved — it first
broadcasts to ranks 1..N-1 (``Leader``: one pickled message, one broadcast on a gloo group,
under one lock so every rank sees the changes in one order), and they make the same change to
their own slices of the store (``follow``): the same blocks in the same places, for their own heads. A pass
message carries what rank 0's pass is given (each row's blocks, first position, tokens, tree
parents; the rows kept; the invariant rules), so every rank runs the same packed pass and its
sums over the ranks meet (``cascade.core.model.tensor_parallel``). The processes themselves:
``cascade.core.parallel.rank_processes``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cascade.core.kv.kv_store import BlockTable, KVStore
from cascade.core.forward.packed import Feed, packed_forward
from cascade.core.model.tensor_parallel import Shard, summed

log = logging.getLogger("cascade.ranks")

MESSAGE_BYTES = 16 * 1024
"""One broadcast carries a message this long (a pass of a few hundred tokens); longer ones
take a second."""


class Leader:
    """Rank 0's side: each store change is broadcast before it is made, in one order."""

    def __init__(self, group, followers: list) -> None:
        self.group = group
        """The process group the messages travel on (None: the default one)."""
        self.followers = followers
        """The follower processes (``rank_processes`` watches and stops them)."""
        self.lock = threading.RLock()
        self._ids = itertools.count()
        self._dropped: list[int] = []
        self.stopped = False

    def send(self, message: tuple) -> None:
        with self.lock:
            dropped, self._dropped = self._dropped, []
            for store_id in dropped:
                _broadcast(("drop", store_id), self.group)
            _broadcast(message, self.group)

    def attach(self, store: KVStore) -> StoreMirror:
        """Create ``store``'s twin on every rank; its changes are mirrored from now on."""
        store_id = next(self._ids)
        self.send(("store", store_id, store.shape, store.capacity, store.zero_values))
        weakref.finalize(store, self._dropped.append, store_id)
        return StoreMirror(self, store_id)

    def rehearse(self, rows: int, width: int, dtype: torch.dtype, count: int) -> None:
        """Every rank sums ``count`` [rows, width] tensors over the ranks, as a pass's
        rowwise layers do, and nothing else (the collectives' own cost)."""
        with self.lock:
            self.send(("rehearse", rows, width, dtype, count))
            rehearse(rows, width, dtype, count)

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(Exception):
            self.send(("stop",))


@dataclass(frozen=True)
class StoreMirror:
    """One store's link to its twins on the other ranks (``KVStore.mirror``)."""

    leader: Leader
    store_id: int

    @contextlib.contextmanager
    def change(self, operation: str, *args):
        """Broadcast the change, then make it here, with no other change in between."""
        with self.leader.lock:
            self.leader.send((operation, self.store_id, *args))
            yield


def follow(model, group) -> None:
    """Ranks 1..N-1: make each change rank 0 broadcasts, until it says stop (or is gone)."""
    stores: dict[int, KVStore] = {}
    while True:
        operation, *args = _receive(group)
        if operation == "stop":
            return
        if operation == "rehearse":
            rehearse(*args)
            continue
        if operation == "store":
            store_id, shape, capacity, zero_values = args
            stores[store_id] = KVStore(shape, capacity, _device_of(model), zero_values)
        elif operation == "drop":
            stores.pop(args[0], None)
        elif operation == "forward":
            _forward(model, stores[args[0]], *args[1:])
        else:
            getattr(stores[args[0]], operation)(*args[1:])


def _forward(model, store: KVStore, rows: list, keep: list[int], *rest) -> None:
    """Rank 0's pass on this rank's slice. A pass that fails here failed on rank 0 too, at the
    same point and before any sum (the same inputs, the same code: a token out of the
    vocabulary, memory): rank 0 reports it to its row's session; both carry on."""
    feeds = [Feed(_table(r.blocks), r.start, list(r.tokens), r.parents) for r in rows]
    store.touch({b for r in rows for b in r.blocks})
    try:
        packed_forward(model, store, feeds, torch.tensor(keep, dtype=torch.long), *rest)
    except (IndexError, ValueError, torch.OutOfMemoryError) as exc:
        log.warning("a pass failed on this rank, as on rank 0: %s", exc)


def _broadcast(message: tuple, group) -> None:
    """Rank 0: one broadcast of ``message`` pickled (two when it is longer than
    ``MESSAGE_BYTES``), its length in front."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    head = len(payload).to_bytes(8, "little") + payload[: MESSAGE_BYTES - 8]
    buffer = torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)
    buffer[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    dist.broadcast(buffer, 0, group=group)
    if len(payload) > MESSAGE_BYTES - 8:
        rest = bytearray(payload[MESSAGE_BYTES - 8 :])
        dist.broadcast(torch.frombuffer(rest, dtype=torch.uint8), 0, group=group)


def _receive(group) -> tuple:
    """Ranks 1..N-1: the next message ``_broadcast`` sends."""
    buffer = torch.empty(MESSAGE_BYTES, dtype=torch.uint8)
    dist.broadcast(buffer, 0, group=group)
    size = int.from_bytes(buffer[:8].numpy().tobytes(), "little")
    data = buffer[8 : 8 + size].numpy().tobytes()
    if size > MESSAGE_BYTES - 8:
        rest = torch.empty(size - (MESSAGE_BYTES - 8), dtype=torch.uint8)
        dist.broadcast(rest, 0, group=group)
        data += rest.numpy().tobytes()
    return pickle.loads(data)


def rehearse(rows: int, width: int, dtype: torch.dtype, count: int) -> None:
    shard = Shard(dist.get_rank(), dist.get_world_size(), None, dist.get_backend())
    device = "cuda" if shard.backend == "nccl" else "cpu"
    tensor = torch.zeros(rows, width, dtype=dtype, device=device)
    for _ in range(count):
        summed(tensor, shard)


def _table(blocks: tuple[int, ...]) -> BlockTable:
    table = BlockTable()
    table.blocks = list(blocks)
    return table


def _device_of(model) -> torch.device:
    return next(model.parameters()).device
