"""The ranks of a tensor-parallel target: rank 0 schedules, the others follow.

Rank 0 is the verifier itself: it runs the engine, the scheduler and the server, and holds all
the bookkeeping (which block is free, whose table holds what, admission, prefix keys). Every
change it makes to a KV store's contents — a pass, a block copied, entries moved — it first
broadcasts to ranks 1..N-1 (``Leader``: one pickled message, one broadcast on a gloo group, under one lock so
every rank sees the changes in one order), and they make the same change to their own slices
of the store (``follow``): the same blocks in the same places, for their own heads. A pass
message carries what rank 0's pass is given (each row's blocks, first position, tokens, tree
parents; the rows kept; the invariant rules), so every rank runs the same packed pass and its
sums over the ranks meet (``cascade.core.tensor_parallel``).

Processes: ``launch`` starts ranks 1..N-1 as child processes of the verifier (one per GPU on
CUDA), waits for each to join and load its slice, with progress in the log, and watches them:
a rank that exits takes the verifier down at once (exit status 70), as any verifier failure,
so its sessions move to another verifier. A follower whose leader is gone exits too.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cascade.core.kv_store import BlockTable, KVStore
from cascade.core.packed import Feed, packed_forward
from cascade.core.runner import ModelRunner
from cascade.core.tensor_parallel import Shard, summed

log = logging.getLogger("cascade.ranks")
RANK_LOST_EXIT = 70
MESSAGE_BYTES = 16 * 1024
"""One broadcast carries a message this long (a pass of a few hundred tokens); longer ones
take a second."""
JOIN_TIMEOUT_S = float(os.environ.get("CASCADE_RANK_JOIN_TIMEOUT_S", 600))


class Leader:
    """Rank 0's side: each store change is broadcast before it is made, in one order."""

    def __init__(self, group, world: int) -> None:
        self.group, self.world = group, world
        self.lock = threading.RLock()
        self._ids = itertools.count()
        self._dropped: list[int] = []
        self.followers: list = []
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
            store, (rows, *rest) = stores[args[0]], args[1:]
            feeds = [Feed(_table(r.blocks), r.start, list(r.tokens), r.parents) for r in rows]
            store.touch({b for r in rows for b in r.blocks})
            packed_forward(model, store, feeds, *rest)
        else:
            getattr(stores[args[0]], operation)(*args[1:])


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


def rank_device(device: str, rank: int) -> str:
    """Rank ``rank``'s device for a verifier started on ``device`` (one GPU per rank)."""
    kind = torch.device(device).type
    return f"{kind}:{rank}" if kind == "cuda" else kind


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def launch(model: str, dtype: str, device: str, world: int, threads: int,
           random_weights: bool = False):
    """Start ranks 1..``world``-1 (``python -m cascade.core.rank_main``) and join them as rank
    0; returns the follower processes (watched: one that exits ends this process) and the
    group messages travel on."""
    port = _free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world), CASCADE_LEADER_PID=str(os.getpid()))
    command = [sys.executable, "-m", "cascade.core.rank_main", "--model", model,
               "--dtype", dtype, "--device", device, "--threads", str(threads)]
    command += ["--random-weights"] if random_weights else []
    followers = [subprocess.Popen(command, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(1, world)]
    log.info("tensor parallel: started ranks 1..%d; waiting for them to join", world - 1)
    for process in followers:
        threading.Thread(target=_watch, args=(process,), daemon=True,
                         name=f"rank-watch-{process.pid}").start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return followers, join(0, world, device)


def join(rank: int, world: int, device: str):
    """Join the group (every rank calls it); returns the gloo group messages travel on."""
    started = time.monotonic()
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(rank_device(device, rank))
    dist.init_process_group(backend_for(device), init_method="env://", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    group = dist.new_group(backend="gloo") if backend_for(device) != "gloo" else None
    log.info("tensor parallel: rank %d of %d joined after %.1f s", rank, world,
             time.monotonic() - started)
    return group


def loaded(rank: int, world: int, group) -> None:
    """Wait until every rank has loaded its slice (rank 0 logs it)."""
    started = time.monotonic()
    dist.barrier(group=group)
    if rank == 0:
        log.info("tensor parallel: all %d ranks loaded their slices (waited %.1f s)", world,
                 time.monotonic() - started)


def load_sharded(spec, world: int, threads: int = 0, random_weights: bool = False):
    """Rank 0's runner of a target split over ``world`` ranks (``spec.device``'s kind: one GPU
    per rank on CUDA): the followers started, joined and loaded, their passes led from here.
    ``stop_ranks(runner)`` (or the process's exit) stops them. ``random_weights``: every rank
    builds the model from its config, seeded alike (``cascade.core.random_weights``)."""
    if threads == 0 and torch.device(spec.device).type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // world)  # the cores shared among the ranks
    if threads:
        torch.set_num_threads(threads)
    followers, group = launch(spec.name_or_path, spec.dtype, spec.device, world, threads,
                              random_weights)
    try:
        runner = ModelRunner.load(spec, Shard(0, world), random_weights)
        loaded(0, world, group)
    except BaseException:
        _stop(None, followers)
        raise
    leader = runner.model.cascade_leader = Leader(group, world)
    leader.followers = followers
    atexit.register(_stop, leader, followers)
    return runner


def stop_ranks(runner) -> None:
    """Stop a sharded runner's followers and leave the group (a whole model: nothing)."""
    leader = getattr(runner.model, "cascade_leader", None)
    if leader is not None:
        _stop(leader, leader.followers)
        runner.model.cascade_leader = None


def _stop(leader: Leader | None, followers: list) -> None:
    if leader is not None and leader.stopped:
        return
    _RELEASED.update(process.pid for process in followers)
    if leader is not None:
        leader.stop()
    for process in followers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        process.kill()
        process.wait()
    if dist.is_initialized():
        dist.destroy_process_group()


_RELEASED: set[int] = set()
"""Follower processes stopped on purpose (their exit ends nothing)."""


def _watch(process: subprocess.Popen) -> None:
    """A follower that exits ends the verifier: its slice of every pass is gone."""
    code = process.wait()
    if process.pid in _RELEASED:
        return
    log.error("tensor parallel: rank process %d exited (status %s): the verifier stops, its "
              "sessions move to another verifier", process.pid, code)
    logging.shutdown()
    os._exit(RANK_LOST_EXIT)


def watch_leader(pid: int) -> None:
    """A follower's watchdog: exit when the leader process is gone."""
    def check() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != pid:
                os._exit(RANK_LOST_EXIT)

    threading.Thread(target=check, daemon=True, name="leader-watch").start()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
