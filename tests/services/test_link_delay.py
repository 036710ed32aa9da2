"""The injected link delay's writer: messages keep their order, a delayed send holds up no
other sender, and without a delay concurrent sends are still written one at a time."""

import asyncio
import time

import pytest

from cascade.serving.mesh.delay import DelayedWriter, LinkDelay


async def test_a_delayed_writer_keeps_order_and_holds_up_no_sender():

    written = []

    async def write(message):
        written.append((message, time.monotonic()))

    writer = DelayedWriter(write, LinkDelay(30.0, 10.0, seed=2).for_session("s"))
    started = time.monotonic()
    for message in range(5):
        await writer.send(message)
    assert time.monotonic() - started < 0.015 and written == []  # sending waits for nothing
    await writer.flush()
    assert [m for m, _ in written] == list(range(5))
    assert all(at - started >= 0.019 for _, at in written)  # each one delayed, in order

    async def broken(message):
        raise ConnectionError("the verifier went away")

    failing = DelayedWriter(broken, LinkDelay(1.0).for_session("s"))
    await failing.send(1)
    await asyncio.sleep(0.02)
    with pytest.raises(ConnectionError, match="went away"):
        await failing.send(2)
    failing.close()


async def test_without_a_delay_sends_from_several_tasks_are_written_one_at_a_time():
    """A session's blocks, shadow blocks and draft-ready notes are sent from different tasks
    on one gRPC stream, which takes one write at a time: a second write while one is pending
    failed the whole call (TOO_MANY_OPERATIONS) and the session went on without its drafter."""
    pending, written = [], []

    async def write(message):
        assert not pending, f"{message} written while {pending[0]} was pending"
        pending.append(message)
        await asyncio.sleep(0.005)  # the transport takes its time
        written.append(pending.pop())

    writer = DelayedWriter(write, LinkDelay(0.0).for_session("s"))
    await asyncio.gather(*(writer.send(n) for n in range(6)))
    await writer.flush()
    assert written == list(range(6))  # in the order sent
