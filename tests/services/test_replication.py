"""Appends wait for every replica in sync (gateway.sessions.replication), on real Redis servers: with
two replicas and ``wait_replicas=1`` a round is on both before it is sent (so whichever one
Sentinel promotes has it), and a hung replica stops being waited for once it falls behind."""

import asyncio
import os
import signal
import time

import pytest
import redis as redis_sync

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import SamplingParams
from cascade.serving.registry import connect
from cascade.tools.redis_ha import RedisHA
from gateway.sessions.replication import IN_SYNC_LAG_S, NotReplicated, ReplicaWaiter, in_sync_replicas
from gateway.sessions.session_store import SessionStore, session_keys


@pytest.mark.parametrize("replicas, expected", [
    ({}, 0),
    ({"slave0": {"state": "online", "lag": 0}, "slave1": {"state": "online", "lag": 1}}, 2),
    ({"slave0": {"state": "online", "lag": IN_SYNC_LAG_S + 1}}, 0),  # hung or cut off
    ({"slave0": {"state": "wait_bgsave", "lag": 0}, "slave1": {"state": "online"}}, 1),
])
def test_in_sync_replicas_are_online_and_current(replicas, expected):
    info = {"role": "master", "connected_slaves": len(replicas), "slave_read_only": 1, **replicas}
    assert in_sync_replicas(info) == expected


def test_a_waiter_needs_at_least_one_replica():
    with pytest.raises(ValueError, match="minimum"):
        ReplicaWaiter(None, 0)


@pytest.fixture
def two_replicas(tmp_path):
    ha = RedisHA(tmp_path, replicas=2, sentinels=1).start()
    yield ha
    ha.stop()


async def test_a_round_waits_for_every_replica_in_sync(two_replicas):
    ha = two_replicas
    client = connect(ha.url)
    slow = ha.servers[2]
    try:
        store = SessionStore(client, wait_replicas=1)
        record = await store.create(GenerationRequest([1, 2], SamplingParams()), "d:1", "v:1")
        await store.append(record.session_id, 1, 0, [7])
        os.kill(slow.process.pid, signal.SIGSTOP)  # one replica pauses (a moment: in sync)
        try:
            append = asyncio.create_task(store.append(record.session_id, 1, 1, [8]))
            await asyncio.sleep(0.4)
            assert not append.done(), "the round was sent while a replica in sync lacked it"
        finally:
            os.kill(slow.process.pid, signal.SIGCONT)
        assert await append == 2
        with redis_sync.Redis(port=slow.port) as replica:
            assert replica.llen(session_keys(record.session_id)[1]) == 2
    finally:
        await client.aclose()


@pytest.mark.parametrize("write", ["create", "restore"])
async def test_a_created_record_and_a_restored_round_wait_for_the_replicas(two_replicas, write):
    """The record and the rounds a restore writes back reach a client (its session id, the
    rounds of its stream) like an appended round: not before every replica in sync has them."""
    ha = two_replicas
    client = connect(ha.url)
    slow = ha.servers[2]
    request = GenerationRequest([1, 2], SamplingParams())
    try:
        store = SessionStore(client, wait_replicas=1)
        record = await store.create(request, "d:1", "v:1")
        os.kill(slow.process.pid, signal.SIGSTOP)
        try:
            if write == "create":
                call = asyncio.create_task(store.create(request, "d:1", "v:1"))
            else:
                call = asyncio.create_task(store.restore(record.session_id, request, 1, "d:1",
                                                         "v:1", [7, 8], [1, 2]))
            await asyncio.sleep(0.4)
            assert not call.done(), f"the {write} returned while a replica in sync lacked it"
        finally:
            os.kill(slow.process.pid, signal.SIGCONT)
        written = await call
        session_id = written.session_id if write == "create" else record.session_id
        record_key, tokens_key, _ = session_keys(session_id)
        with redis_sync.Redis(port=slow.port) as replica:
            assert replica.hget(record_key, "epoch") == b"1"
            assert replica.llen(tokens_key) == (0 if write == "create" else 2)
    finally:
        await client.aclose()


async def test_a_hung_replica_is_not_waited_for_once_it_falls_behind(two_replicas):
    ha = two_replicas
    client = connect(ha.url)
    hung = ha.servers[2]
    try:
        store = SessionStore(client, wait_replicas=1, wait_ms=400)
        store.waiter.max_lag_s = 1
        record = await store.create(GenerationRequest([1, 2], SamplingParams()), "d:1", "v:1")
        os.kill(hung.process.pid, signal.SIGSTOP)
        try:
            assert await store.append(record.session_id, 1, 0, [7]) == 1  # the other has it
            assert store.waiter.target == 1
            started = time.monotonic()
            assert await store.append(record.session_id, 1, 1, [8]) == 2
            assert time.monotonic() - started < 0.4  # not waiting for the hung one any more
        finally:
            os.kill(hung.process.pid, signal.SIGCONT)
    finally:
        await client.aclose()


def test_a_restarted_node_is_not_promotable_until_it_has_synced(tmp_path):
    """A node that comes back holds only what it had when it stopped: Sentinel must not
    promote it over the replica that acknowledged everything since (priority 0 until synced)."""
    ha = RedisHA(tmp_path, replicas=1, sentinels=3).start()
    try:
        old = ha.primary_port()
        node = ha.server_on(old)
        node.process.kill()
        node.process.wait()
        new = ha.server_on(ha.wait_for_failover(old))
        os.kill(new.process.pid, signal.SIGSTOP)  # the node cannot sync while this hangs
        try:
            ha.restart(node)
            with redis_sync.Redis(port=node.port) as client:
                assert client.config_get("replica-priority") == {"replica-priority": "0"}
        finally:
            os.kill(new.process.pid, signal.SIGCONT)
        with redis_sync.Redis(port=node.port) as client:
            deadline = time.monotonic() + 20
            while client.config_get("replica-priority")["replica-priority"] != "100":
                assert time.monotonic() < deadline, "never promotable after syncing"
                time.sleep(0.1)
            assert client.info("replication")["master_link_status"] == "up"
    finally:
        ha.stop()


class _ScriptedPipeline:
    """A pipeline whose executions return the given results in turn (a unit test of the
    waiter's decisions; the real-Redis tests above cover the commands themselves)."""

    def __init__(self, results: list[list]) -> None:
        self.results = results

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    def execute_command(self, *args) -> None:
        pass

    def info(self, section: str) -> None:
        pass

    async def execute(self) -> list:
        return self.results.pop(0)


class _ScriptedClient:
    def __init__(self, results: list[list]) -> None:
        self.pipe = _ScriptedPipeline(results)

    def register_script(self, text: str):
        async def run(keys, args, client) -> None:
            pass
        return run

    def pipeline(self, transaction: bool) -> _ScriptedPipeline:
        return self.pipe


async def test_a_round_the_new_primary_lacks_is_not_replicated_whatever_its_wait_says():
    both = {"slave0": {"state": "online", "lag": 0}, "slave1": {"state": "online", "lag": 0}}
    client = _ScriptedClient([[5, 1, both],  # the append; one of the two replicas has it
                              [0, 2, both]])  # the probe: this primary lacks the round
    waiter = ReplicaWaiter(client, 1)
    with pytest.raises(NotReplicated):
        await waiter.write(client.register_script(""), ["record", "tokens", "rounds"], [])
    assert client.pipe.results == []
