"""The drafters' speculation-memory feed on an idle stream, through the pods' own Redis client."""

import asyncio
import logging

from cascade.serving.memory_stream import MemoryFeed
from cascade.serving.registry import connect


async def test_an_idle_stream_is_followed_without_timeouts(redis_server, caplog):
    """Each read waits for new entries inside the client's socket timeout, so nothing fails
    while nobody writes (a read blocking as long as the timeout failed every time)."""
    client = connect(redis_server.url, retries=0)  # the pods' 2 s socket timeout, no retries
    # to hide a timed-out read
    batches = []
    feed = MemoryFeed(client, batches.append, stream="cascade:memory:idle-test")
    with caplog.at_level(logging.WARNING, logger="cascade.serving.memory_stream"):
        await feed.start()
        await asyncio.sleep(3.0)
        await feed.stop()
    await client.aclose()
    assert not [r for r in caplog.records if "cannot read" in r.getMessage()]
    assert batches == []
