"""Prefix affinity through a real Redis: a prompt goes to the pods that served a prefix of it,
while their load allows, and never across scopes."""

from cascade.protocol.prefix_keys import BLOCK_SIZE
from cascade.serving.registry import Heartbeat
from gateway.sessions.prefix_routing import PrefixRouter

CHAT = list(range(3, 3 + 2 * BLOCK_SIZE + 10))


async def _register(client, loads: dict[str, int], role: str = "verifier") -> None:
    for address, load in loads.items():
        await Heartbeat(client, role, address, lambda load=load: load).beat()


async def test_a_prompt_goes_to_the_verifier_of_its_longest_served_prefix(redis_client):
    await _register(redis_client, {"v1:1": 0, "v2:1": 2, "v3:1": 1})
    router = PrefixRouter(redis_client, slack=2)

    async def pick(tokens, scope="key:a", exclude=frozenset()):
        return await router.pick("verifier", tokens, scope, set(exclude))

    assert await pick(CHAT) is None  # nothing served yet: load decides
    await router.served(CHAT[: 2 * BLOCK_SIZE], "key:a", "v2:1")
    await router.served(CHAT[:BLOCK_SIZE], "key:a", "v3:1")  # the first block's latest server
    assert await pick(CHAT + [7, 8]) == "v2:1"  # the longest prefix
    assert await pick(CHAT[: BLOCK_SIZE + 5]) == "v3:1"
    assert await pick(CHAT, scope="key:b") is None  # another tenant's prefixes
    assert await pick(CHAT, exclude={"v2:1"}) == "v3:1"  # excluded: the next longest
    assert await pick(CHAT[: BLOCK_SIZE - 1]) is None  # no full block


async def test_a_busy_prefix_holder_gives_way_to_load(redis_client):
    await _register(redis_client, {"v1:1": 0, "v2:1": 5})
    router = PrefixRouter(redis_client, slack=4)
    await router.served(CHAT, "key:a", "v2:1")
    assert await router.pick("verifier", CHAT, "key:a", set()) is None  # 5 over the idle one
    await _register(redis_client, {"v2:1": 4})
    assert await router.pick("verifier", CHAT, "key:a", set()) == "v2:1"


async def test_drafters_are_remembered_apart_from_verifiers(redis_client):
    await _register(redis_client, {"v1:1": 0})
    await _register(redis_client, {"d1:1": 0, "d2:1": 0}, role="drafter")
    router = PrefixRouter(redis_client)
    await router.served(CHAT, "key:a", "v1:1", "d2:1")
    assert await router.pick("drafter", CHAT, "key:a", set()) == "d2:1"
    assert await router.pick("verifier", CHAT, "key:a", set()) == "v1:1"
    await router.served(CHAT, "key:a", "v1:1")  # decoded alone: the drafter's record stays
    assert await router.pick("drafter", CHAT, "key:a", set()) == "d2:1"
