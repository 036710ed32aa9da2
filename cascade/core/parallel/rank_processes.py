"""The processes of a tensor-parallel target: rank 0 starts the others and watches them.

``load_sharded`` starts ranks 1..N-1 as child processes of the verifier
(``python -m cascade.core.parallel.rank_main``, torch's usual environment; one GPU per rank on CUDA),
joins them as rank 0, waits for each to load its slice, with progress in the log, and makes
rank 0's runner lead them (``cascade.core.parallel.ranks``). It watches them: a rank that exits takes
the verifier down at once (exit status 70), as any verifier failure, so its sessions move to
another verifier. A follower whose leader is gone exits too.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

from cascade.core.parallel.ranks import Leader
from cascade.core.model.runner import ModelRunner
from cascade.core.model.tensor_parallel import Shard

log = logging.getLogger("cascade.ranks")
RANK_LOST_EXIT = 70
JOIN_TIMEOUT_S = float(os.environ.get("CASCADE_RANK_JOIN_TIMEOUT_S", 600))


def rank_device(device: str, rank: int) -> str:
    """Rank ``rank``'s device for a verifier started on ``device`` (one GPU per rank)."""
    kind = torch.device(device).type
    return f"{kind}:{rank}" if kind == "cuda" else kind


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def launch(model: str, dtype: str, device: str, world: int, threads: int,
           random_weights: bool = False):
    """Start ranks 1..``world``-1 (``python -m cascade.core.parallel.rank_main``) and join them as rank
    0; returns the follower processes (watched: one that exits ends this process) and the
    group messages travel on."""
    port = _free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world), CASCADE_LEADER_PID=str(os.getpid()))
    command = [sys.executable, "-m", "cascade.core.parallel.rank_main", "--model", model,
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
    with _progress(rank, "join"):
        dist.init_process_group(backend_for(device), init_method="env://", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    group = dist.new_group(backend="gloo") if backend_for(device) != "gloo" else None
    log.info("tensor parallel: rank %d of %d joined after %.1f s", rank, world,
             time.monotonic() - started)
    return group


@contextlib.contextmanager
def _progress(rank: int, what: str, every_s: float = 10.0):
    """Rank 0 logs every ``every_s`` while the block waits for the other ranks to ``what``."""
    done, started = threading.Event(), time.monotonic()

    def report() -> None:
        while not done.wait(every_s):
            log.info("tensor parallel: waiting for the ranks to %s (%.0f s)", what,
                     time.monotonic() - started)

    if rank == 0:
        threading.Thread(target=report, daemon=True, name="rank-progress").start()
    try:
        yield
    finally:
        done.set()


def loaded(rank: int, world: int, group) -> None:
    """Wait until every rank has loaded its slice (rank 0 logs it)."""
    started = time.monotonic()
    with _progress(rank, "load their slices"):
        dist.barrier(group=group)
    if rank == 0:
        log.info("tensor parallel: all %d ranks loaded their slices (waited %.1f s)", world,
                 time.monotonic() - started)


def load_sharded(spec, world: int, threads: int = 0, random_weights: bool = False):
    """Rank 0's runner of a target split over ``world`` ranks (``spec.device``'s kind: one GPU
    per rank on CUDA): the followers started, joined and loaded, their passes led from here.
    ``stop_ranks(runner)`` (or the process's exit) stops them. ``random_weights``: every rank
    builds the model from its config, seeded alike (``cascade.core.model.weights``)."""
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
    leader = runner.model.cascade_leader = Leader(group, followers)
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
