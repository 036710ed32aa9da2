"""What pods keep about peers they no longer see: client channels and sessions' epochs are
dropped once unused, so neither map grows with every pod or session a process ever met."""

import asyncio
import time

from cascade.serving.channels import ChannelPool

from verifier_service.epochs import EpochMemory


async def test_channels_nobody_uses_are_closed_and_held_ones_kept():
    """Pods come and go: a channel idle past idle_close_s is closed (the pool would otherwise
    keep one per dead pod forever), one a stream holds is not."""
    pool = ChannelPool(idle_close_s=0.05)
    with pool.using("127.0.0.1:1") as held:
        gone = pool.get("127.0.0.1:2")
        await asyncio.sleep(0.1)
        pool.get("127.0.0.1:3")
        assert len(pool) == 2 and pool.get("127.0.0.1:1") is held
    await asyncio.sleep(0.05)
    assert pool.get("127.0.0.1:2") is not gone  # a fresh one
    await pool.close()


def test_epochs_of_closed_sessions_are_kept_for_a_while_then_dropped():
    memory = EpochMemory(keep_s=0.05, max_closed=2)
    memory.opened("a", 3)
    memory.closed("a")
    assert memory.get("a") == 3  # an older epoch's late open is still refused
    for sid in ("b", "c", "d"):
        memory.opened(sid, 1)
        memory.closed(sid)
    assert memory.get("a") == 0 and len(memory) == 2  # beyond max_closed, oldest first
    time.sleep(0.06)
    memory.opened("e", 1)
    assert len(memory) == 1 and memory.get("e") == 1  # past keep_s
