"""Session state against a real Redis server: fencing, ordering, TTLs."""

import pytest

from cascade.serving.errors import StaleEpoch
from cascade.protocol.settings import DraftConfig, SamplingParams
from gateway.sessions.generation import GenerationRequest
from gateway.sessions.session_store import LengthMismatch, SessionStore

REQUEST = GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=8), DraftConfig(4))


async def test_append_checks_epoch_and_length(redis_client):
    store = SessionStore(redis_client, ttl_s=60)
    record = await store.create(REQUEST, "d:1", "v:1")
    assert await store.append(record.session_id, 1, 0, [1, 2]) == 2
    assert await store.append(record.session_id, 1, 0, [1, 2]) == 2  # a retry: no-op success
    with pytest.raises(LengthMismatch):
        await store.append(record.session_id, 1, 0, [1, 3])  # another chunk at that length
    with pytest.raises(LengthMismatch):
        await store.append(record.session_id, 1, 1, [7])  # a stale length, other tokens
    with pytest.raises(StaleEpoch):
        await store.append(record.session_id, 0, 2, [3])
    assert await store.tokens(record.session_id) == [1, 2]


async def test_reassign_fences_out_the_old_owner(redis_client):
    store = SessionStore(redis_client, ttl_s=60)
    record = await store.create(REQUEST, "d:1", "v:1")
    new_epoch = await store.reassign(record.session_id, 1, "d:2", "v:1")
    assert new_epoch == 2
    with pytest.raises(StaleEpoch):
        await store.append(record.session_id, 1, 0, [9])  # the paused old owner
    with pytest.raises(StaleEpoch):
        await store.reassign(record.session_id, 1, "d:3", "v:1")
    await store.append(record.session_id, 2, 0, [4])
    await store.finish(record.session_id, 2, "finished")
    saved = await store.record(record.session_id)
    assert saved["drafter"] == "d:2" and saved["status"] == "finished" and saved["epoch"] == "2"
    assert await store.tokens(record.session_id) == [4]


async def test_everything_expires(redis_client):
    store = SessionStore(redis_client, ttl_s=30)
    record = await store.create(REQUEST, "d:1", "v:1")
    await store.append(record.session_id, 1, 0, [1])
    keys = [k async for k in redis_client.scan_iter(match="cascade:session:*")]
    assert len(keys) == 3  # record, tokens, round ends
    for key in keys:
        assert 0 < await redis_client.ttl(key) <= 30


async def test_a_client_survives_a_redis_restart_within_its_retries(tmp_path):
    """connect(): timeouts plus backoff retries carry a call across a short Redis outage."""
    import asyncio

    from cascade.tools.redis_server import RedisServer, free_port
    from gateway.sessions.session_store import connect

    port = free_port()
    server = RedisServer(tmp_path / "a", port=port).start()
    client = connect(f"redis://127.0.0.1:{port}/0")
    try:
        await client.set("k", "1")
        server.stop()

        async def restart_soon():
            await asyncio.sleep(0.5)
            return RedisServer(tmp_path / "b", port=port).start()

        restarting = asyncio.create_task(restart_soon())
        await client.set("k", "2")  # retried with backoff until Redis is back
        server = await restarting
        assert await client.get("k") == b"2"
    finally:
        await client.aclose()
        server.stop()


async def test_writes_lost_by_a_redis_restart_are_written_back(redis_client):
    """A restart without the last second of the append-only file loses a tail of tokens, or
    the whole record; the gateway's restore writes back what it holds, and refuses when a later
    epoch owns the session or the stored tokens are not a prefix of its own."""
    from gateway.sessions.session_store import SessionLost, session_keys

    store = SessionStore(redis_client, ttl_s=60)
    record = await store.create(REQUEST, "d:1", "v:1")
    await store.append(record.session_id, 1, 0, [1, 2, 3])
    record_key, tokens_key, rounds_key = session_keys(record.session_id)
    await redis_client.rpop(tokens_key)  # the lost tail
    with pytest.raises(LengthMismatch):
        await store.append(record.session_id, 1, 3, [4])
    await store.restore(record.session_id, REQUEST, 1, "d:1", "v:1", [1, 2, 3, 4], [3, 4])
    assert await store.tokens(record.session_id) == [1, 2, 3, 4]
    assert await store.round_ends(record.session_id) == [3, 4]

    await redis_client.delete(record_key, tokens_key, rounds_key)  # the whole session lost
    with pytest.raises(SessionLost):
        await store.append(record.session_id, 1, 4, [5])
    await store.restore(record.session_id, REQUEST, 1, "d:1", "v:1", [1, 2, 3, 4, 5], [3, 4, 5])
    saved = await store.record(record.session_id)
    assert saved["epoch"] == "1" and saved["status"] == "running" and saved["prompt_len"] == "3"
    assert await store.append(record.session_id, 1, 5, [6]) == 6

    with pytest.raises(LengthMismatch):  # Redis holds tokens the gateway never sent
        await store.restore(record.session_id, REQUEST, 1, "d:1", "v:1", [1, 2, 9], [3])
    await store.reassign(record.session_id, 1, "d:2", "v:2")
    with pytest.raises(StaleEpoch):  # another gateway took over meanwhile
        await store.restore(record.session_id, REQUEST, 1, "d:1", "v:1", [1, 2, 3, 4, 5, 6, 7],
                            [7])
    assert await store.tokens(record.session_id) == [1, 2, 3, 4, 5, 6]


async def test_a_session_is_taken_over_only_when_its_lease_lapses_or_it_was_cancelled(
        redis_client):
    """Rounds are stored with their ends (a resumed stream replays them); another gateway gets
    a new epoch only after the owner's lease expires, and nothing once the session ended."""
    import asyncio

    from gateway.sessions.session_store import LeaseHeld, SessionEnded, request_from_record

    owner = SessionStore(redis_client, ttl_s=60, owner="gateway-a", lease_s=0.5)
    other = SessionStore(redis_client, ttl_s=60, owner="gateway-b", lease_s=0.5)
    record = await owner.create(REQUEST, "d:1", "v:1")
    sid = record.session_id
    with pytest.raises(LeaseHeld):  # leased from its creation, before any round
        await other.takeover(sid)
    await owner.append(sid, 1, 0, [1, 2])
    await owner.append(sid, 1, 2, [3])
    assert await owner.round_ends(sid) == [2, 3]
    assert request_from_record(await owner.record(sid)) == REQUEST
    with pytest.raises(LeaseHeld):
        await other.takeover(sid)
    assert await owner.renew(sid, 1)
    await asyncio.sleep(0.7)  # the owner died: nobody renews
    epoch = await other.takeover(sid)
    assert epoch == 2 and (await other.record(sid))["owner"] == "gateway-b"
    assert not await owner.renew(sid, 1)  # the old owner is fenced out
    with pytest.raises(StaleEpoch):
        await owner.append(sid, 1, 3, [4])
    await other.finish(sid, epoch, "cancelled")  # its client left: a cancelled session resumes
    assert await owner.takeover(sid) == 3
    await owner.finish(sid, 3, "finished", "length")
    with pytest.raises(SessionEnded):
        await other.takeover(sid)
    assert (await owner.record(sid))["finish_reason"] == "length"


async def test_the_final_round_records_the_session_finished_in_the_same_step(redis_client):
    """No stored session is complete but still running: the final append marks it finished
    (a retry of it changes nothing), and another gateway then has nothing to take over."""
    from gateway.sessions.session_store import SessionEnded

    store = SessionStore(redis_client, ttl_s=60, lease_s=0.2)
    sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.append(sid, 1, 0, [1, 2, 3])
    assert await store.append(sid, 1, 3, [4], "length") == 4
    assert await store.append(sid, 1, 3, [4], "length") == 4  # a retry
    saved = await store.record(sid)
    assert saved["status"] == "finished" and saved["finish_reason"] == "length"
    assert await store.round_ends(sid) == [3, 4]
    with pytest.raises(SessionEnded):
        await SessionStore(redis_client, ttl_s=60, owner="other").takeover(sid)


async def test_a_refused_restore_writes_nothing(redis_client):
    from gateway.sessions.session_store import session_keys

    store = SessionStore(redis_client, ttl_s=60)
    sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.append(sid, 1, 0, [1, 2])
    before = await redis_client.hgetall(session_keys(sid)[0])
    with pytest.raises(LengthMismatch):  # Redis holds tokens the gateway never had
        await store.restore(sid, REQUEST, 1, "d:9", "v:9", [7, 7, 7], [3], "length")
    assert await redis_client.hgetall(session_keys(sid)[0]) == before


async def test_an_epoch_bump_lost_by_redis_is_told_apart_from_a_newer_owner(redis_client):
    """A stored epoch below the writer's (a restart lost a reassign) is EpochBehind, which the
    gateway repairs by writing back; one above it stays StaleEpoch (fenced out)."""
    from gateway.sessions.session_store import EpochBehind, session_keys

    store = SessionStore(redis_client, ttl_s=60)
    sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.append(sid, 1, 0, [1])
    assert await store.reassign(sid, 1, "d:2", "v:1") == 2
    await redis_client.hset(session_keys(sid)[0], "epoch", 1)  # the bump is lost
    with pytest.raises(EpochBehind):
        await store.append(sid, 2, 1, [2])
    await store.restore(sid, REQUEST, 2, "d:2", "v:1", [1, 2], [1, 2])
    assert await store.append(sid, 2, 2, [3]) == 3
    with pytest.raises(StaleEpoch):
        await store.append(sid, 1, 3, [4])


async def test_a_reassign_tells_a_lost_record_and_a_lost_bump_from_a_newer_owner(redis_client):
    """What a failover to a replica that had not received the record (or the last epoch bump)
    leaves: reassign says SessionLost / EpochBehind, which the gateway repairs by writing back
    what it holds and reassigning again; a newer owner's epoch stays StaleEpoch."""
    from gateway.sessions.session_store import EpochBehind, SessionLost, session_keys

    store = SessionStore(redis_client, ttl_s=60)
    sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.append(sid, 1, 0, [1])
    await redis_client.delete(*session_keys(sid))  # the record never reached the replica
    with pytest.raises(SessionLost):
        await store.reassign(sid, 1, "d:2", "v:1")
    await store.restore(sid, REQUEST, 1, "d:2", "v:1", [1], [1])
    assert await store.reassign(sid, 1, "d:2", "v:1") == 2
    await redis_client.hset(session_keys(sid)[0], "epoch", 1)  # the bump is lost
    with pytest.raises(EpochBehind):
        await store.reassign(sid, 2, "d:3", "v:1")
    await redis_client.hset(session_keys(sid)[0], "epoch", 5)  # a newer owner
    with pytest.raises(StaleEpoch):
        await store.reassign(sid, 2, "d:3", "v:1")
    assert await store.tokens(sid) == [1]


async def test_a_live_lease_is_never_taken_over_even_by_its_own_gateway(redis_client):
    """A second caller resuming on the gateway that streams the session must wait for that
    stream to end (or lapse): it does not take the live stream over."""
    from gateway.sessions.session_store import LeaseHeld

    store = SessionStore(redis_client, ttl_s=60, owner="gateway-a", lease_s=5)
    sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
    with pytest.raises(LeaseHeld):
        await store.takeover(sid)
    await store.finish(sid, 1, "cancelled")  # its stream ended: now it may
    assert await store.takeover(sid) == 2


async def test_a_stored_grammar_comes_back(redis_client):
    """A moved or resumed session keeps its structured output (the record is JSON)."""
    from cascade.protocol.grammar import Grammar
    from gateway.sessions.session_store import request_from_record

    grammar = Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    request = GenerationRequest([5, 6], SamplingParams(max_new_tokens=8, grammar=grammar))
    store = SessionStore(redis_client, ttl_s=60)
    record = await store.create(request, "d:1", "v:1")
    assert request_from_record(await store.record(record.session_id)) == request
