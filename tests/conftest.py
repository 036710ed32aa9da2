import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)


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
