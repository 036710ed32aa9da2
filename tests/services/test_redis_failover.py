"""Redis with replicas and sentinels (cascade.tools.redis_ha), reached through a
``redis+sentinel://`` URL: a client of every service's kind follows the primary through a
failover after the primary is killed (kill -9), and what was acknowledged by a replica is
still there."""

import asyncio

import pytest

from cascade.serving.redis_url import parse_sentinel
from cascade.serving.registry import connect
from cascade.tools.redis_ha import RedisHA


def test_sentinel_urls_parse_and_bad_ones_say_what_is_wrong():
    address = parse_sentinel("redis+sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2:26380/cascade/2")
    assert address.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (address.service, address.db, address.password) == ("cascade", 2, "p@ss")
    assert address.sentinel_password == "p@ss"  # the data nodes' unless said otherwise
    assert parse_sentinel("redis+sentinel://h:1/s?sentinel_password=x").sentinel_password == "x"
    for bad in ("redis+sentinel://h:1", "redis+sentinel://h/s", "redis+sentinel:///s"):
        with pytest.raises(ValueError):
            parse_sentinel(bad)


@pytest.mark.parametrize("password", ["Zq?7#kV", "x@Q9?v#J", "Jp?3/Wf@y", "?#@"])
def test_a_raw_password_parses_or_is_refused_without_being_echoed(password):
    """A password with characters a URL reserves (``?``, ``#``, ``@``, ``/``) that were not
    percent-encoded: read whole where the hosts still tell where it ends, and an error (here,
    a host without a port) never shows any part of it."""
    hosts = "10.0.0.1:26379,10.0.0.2:26380"
    address = parse_sentinel(f"redis+sentinel://:{password}@{hosts}/cascade/1"
                             "?sentinel_password=other")
    assert address.password == password
    assert (address.sentinels[1], address.service, address.db) == (("10.0.0.2", 26380),
                                                                    "cascade", 1)
    assert address.sentinel_password == "other"
    for bad in (f"redis+sentinel://:{password}@10.0.0.1/cascade",
                f"redis+sentinel://:{password}@/cascade",
                f"redis+sentinel://:{password}@10.0.0.1:26379",
                f"redis+sentinel://:{password}"):
        with pytest.raises(ValueError) as error:
            parse_sentinel(bad)
        message = str(error.value)
        fragments = {password[i:j] for i in range(len(password))
                     for j in range(i + 3, len(password) + 1)}
        assert not [f for f in fragments if f in message], message


async def test_a_client_follows_the_primary_through_a_failover(tmp_path):
    ha = RedisHA(tmp_path, replicas=1, sentinels=3, password="secret").start()
    client = connect(ha.url)
    try:
        await client.set("cascade:test", "before")
        assert await client.execute_command("WAIT", 1, 2000) == 1  # a replica has it
        old = ha.primary_port()
        ha.server_on(old).process.kill()
        new = await asyncio.to_thread(ha.wait_for_failover, old)
        assert new != old
        assert await client.get("cascade:test") == b"before"
        await client.set("cascade:test", "after")
        assert await client.get("cascade:test") == b"after"
    finally:
        try:
            await client.aclose()
        finally:
            ha.stop()


async def test_a_script_reaching_a_demoted_primary_follows_the_new_one(tmp_path):
    """A primary demoted without dying (a forced failover; or one that came back after a
    failover): the client's open connection now reaches a replica, and a Lua script's
    READONLY error must send it to the sentinels again instead of failing every call."""
    ha = RedisHA(tmp_path, replicas=1, sentinels=3, password="secret").start()
    client = connect(ha.url)
    script = client.register_script("return redis.call('set', KEYS[1], ARGV[1])")
    try:
        assert await script(keys=["cascade:test"], args=["before"]) == b"OK"
        old = ha.primary_port()
        ha.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "cascade")
        await asyncio.to_thread(ha.wait_for_failover, old)
        demoted = ha.server_on(old).sync_client()
        await asyncio.to_thread(_wait_role, demoted, "slave")
        assert await script(keys=["cascade:test"], args=["after"]) == b"OK"
        assert await client.get("cascade:test") == b"after"
    finally:
        try:
            await client.aclose()
        finally:
            ha.stop()


def _wait_role(client, role: str, timeout_s: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout_s
    while client.info("replication")["role"] != role:
        assert time.monotonic() < deadline, f"the server did not become a {role}"
        time.sleep(0.1)


async def test_appends_wait_for_a_replica_when_asked(tmp_path):
    import redis as redis_sync

    from cascade.protocol.request.mapping import GenerationRequest
    from cascade.protocol.settings import SamplingParams
    from cascade.serving import metrics
    from gateway.sessions.session_store import NotReplicated, SessionStore, session_keys

    ha = RedisHA(tmp_path, replicas=1, sentinels=1, password="secret").start()
    client = connect(ha.url)
    replica = redis_sync.Redis(port=ha.servers[1].port, password="secret")
    try:
        store = SessionStore(client, wait_replicas=1)
        record = await store.create(GenerationRequest([1, 2, 3], SamplingParams()), "d:1", "v:1")
        for round_number in range(20):
            await store.append(record.session_id, 1, round_number, [7])
            tokens_key = session_keys(record.session_id)[1]
            assert replica.llen(tokens_key) == round_number + 1  # on the replica already
        missing = metrics.UNREPLICATED_APPENDS._value.get()
        too_many = SessionStore(client, wait_replicas=2, wait_ms=50)  # there is one replica
        with pytest.raises(NotReplicated, match="1 of 2 replicas"):  # must not reach a client
            await too_many.append(record.session_id, 1, 20, [8])
        assert metrics.UNREPLICATED_APPENDS._value.get() == missing + 1
        # It is on the primary: a retry of the same round (a resumed stream) succeeds as one.
        assert await store.append(record.session_id, 1, 20, [8]) == 21
    finally:
        try:
            replica.close()
            await client.aclose()
        finally:
            ha.stop()


async def test_a_command_in_flight_when_the_primary_dies_goes_to_the_new_one(tmp_path):
    """The connection that carried a command when the primary died is retried by the client
    itself; it must ask the sentinels again, not dial the dead primary until its retries run
    out (redis-py reconnects such a connection to its old address)."""
    ha = RedisHA(tmp_path, replicas=1, sentinels=3, password="secret").start()
    client = connect(ha.url)
    try:
        await client.set("cascade:test", "before")
        assert await client.execute_command("WAIT", 1, 2000) == 1
        old = ha.primary_port()
        blocked = asyncio.create_task(client.blpop(["cascade:empty"], timeout=1))
        await asyncio.sleep(0.3)  # the pop is waiting on the primary
        ha.server_on(old).process.kill()
        assert await asyncio.wait_for(blocked, 30) is None  # retried on the new primary
        assert ha.primary_port() != old
        assert await client.get("cascade:test") == b"before"
    finally:
        try:
            await client.aclose()
        finally:
            ha.stop()


async def test_a_session_survives_the_primary_once_created_or_restored(tmp_path):
    """With ``wait_replicas``, a created record and restored rounds are on the replica when the
    call returns, so a failover right after keeps them; a create the replica never received
    fails instead of returning a session the new primary lacks."""
    import os
    import signal

    from redis.exceptions import ConnectionError as RedisConnectionError

    from cascade.protocol.request.mapping import GenerationRequest
    from cascade.protocol.settings import SamplingParams
    from gateway.sessions.session_store import SessionStore

    ha = RedisHA(tmp_path, replicas=1, sentinels=3, password="secret").start()
    client = connect(ha.url)
    replica = ha.servers[1]
    request = GenerationRequest([1, 2, 3], SamplingParams())
    try:
        store = SessionStore(client, wait_replicas=1, wait_ms=500)
        kept = await store.create(request, "d:1", "v:1")
        await store.restore(kept.session_id, request, 1, "d:1", "v:1", [7, 8], [1, 2])
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            lost = asyncio.create_task(store.create(request, "d:1", "v:1"))
            await asyncio.sleep(0.3)
            assert not lost.done(), "a session was created that no replica had"
            old = ha.primary_port()
            ha.server_on(old).process.kill()
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert await asyncio.to_thread(ha.wait_for_failover, old) == replica.port
        with pytest.raises(RedisConnectionError):
            await lost
        assert await store.tokens(kept.session_id) == [7, 8]
        assert await store.round_ends(kept.session_id) == [1, 2]
        assert (await store.record(kept.session_id))["epoch"] == "1"
    finally:
        try:
            await client.aclose()
        finally:
            ha.stop()
