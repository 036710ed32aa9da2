import os
import sys
from pathlib import Path

import pytest
import torch

# The helpers every test imports by name (models, distributions, references, tokenizers).
sys.path.insert(0, str(Path(__file__).parent / "helpers"))

# The longest test files, longest first: with several workers (pytest -n) they start first, so
# that no worker is left with one of them at the end while the others idle.
LONGEST_FIRST = (
    "e2e/test_chaos.py", "bench/test_load_smoke.py", "bench/test_bench_smoke.py",
    "core/model/test_tensor_parallel.py", "core/sample/test_processor_sampling.py",
    "core/memory/test_suffix.py", "e2e/test_local_cluster.py", "distill/test_feature_distill.py",
    "core/proposers/test_auto_drafting.py", "distill/test_distill.py", "e2e/test_resume.py",
    "e2e/test_tensor_parallel_e2e.py", "e2e/test_faults.py",
    "core/model/test_tensor_parallel_three_ranks.py", "core/verify/test_invariant.py",
    "services/test_redis_failover.py", "core/proposers/test_recursive_trees.py",
    "e2e/test_bf16_exactness.py", "bench/test_engine_bench.py", "core/verify/test_compiled.py",
    "bench/test_tp_bench.py", "bench/test_memory_bench.py", "e2e/test_real_pair.py",
    "e2e/test_rtt_bench.py", "e2e/test_redis_failover_e2e.py",
)
# Tiny models gain nothing from a second thread; with two workers (pytest -n 2) each takes a core.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def gpt2_pair():
    from models import tiny_gpt2

    return tiny_gpt2(seed=1, num_layers=3), tiny_gpt2(seed=2, num_layers=1, width=32)


@pytest.fixture(scope="session")
def llama_pair():
    from models import tiny_llama

    return tiny_llama(seed=3, num_layers=3), tiny_llama(seed=4, num_layers=1, width=32)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on a free loopback port for the whole test session."""
    from cascade.tools.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
async def redis_client(redis_server):
    import redis.asyncio as redis

    client = redis.from_url(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """The tiny target and drafter folders (``cascade.tools.tiny_models``)."""
    from cascade.tools.tiny_models import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_runners(tiny_pair_dirs):
    """The tiny pair loaded: (target, drafter)."""
    from cascade.core.model.runner import ModelRunner, ModelSpec
    from models import DEVICE

    target_dir, drafter_dir = tiny_pair_dirs
    return (ModelRunner.load(ModelSpec(str(target_dir), device=DEVICE)),
            ModelRunner.load(ModelSpec(str(drafter_dir), device=DEVICE)))


def pytest_collection_modifyitems(config, items):
    """With several workers (``--dist loadfile``: a file's tests on one worker, so a fixture
    a module shares is built once), the longest files first."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.removeprefix("tests/").split("::")[0],
                                         len(rank)))
