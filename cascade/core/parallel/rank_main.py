"""python -m cascade.core.parallel.rank_main: one follower rank of a tensor-parallel verifier.

Started by the verifier (``cascade.core.parallel.rank_processes.launch``) with torch's usual environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): it joins the group, loads its
slice of the target and makes every change rank 0 broadcasts until told to stop, or until
rank 0 is gone (signals are rank 0's to handle)."""

from __future__ import annotations

import argparse
import logging
import os
import signal

import torch

from cascade.core.parallel import rank_processes

from cascade.core.parallel import ranks
from cascade.core.forward.packed_backend import enable
from cascade.core.model.runner import DTYPES, ModelRunner, ModelSpec
from cascade.core.model.tensor_parallel import Shard
from cascade.core.model.weights import load_causal_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format=f"%(asctime)s rank-{os.environ['RANK']} "
                        "%(name)s %(levelname)s %(message)s")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for signum in (signal.SIGINT, signal.SIGTERM):  # a terminal's Ctrl-C reaches every rank:
        signal.signal(signum, signal.SIG_IGN)  # the leader drains, then stops the followers
    rank_processes.watch_leader(int(os.environ["CASCADE_LEADER_PID"]))
    group = rank_processes.join(rank, world, args.device)
    spec = ModelSpec(args.model, args.dtype, rank_processes.rank_device(args.device, rank))
    runner = ModelRunner(load_causal_lm(spec.name_or_path, DTYPES[spec.dtype], spec.device,
                                        Shard(rank, world), args.random_weights))
    enable(runner.model)
    rank_processes.loaded(rank, world, group)
    try:
        ranks.follow(runner.model, group)
    except RuntimeError as exc:  # the leader is gone (its sockets closed)
        raise SystemExit(f"rank {rank}: the leader is gone ({exc})") from None


if __name__ == "__main__":
    main()
