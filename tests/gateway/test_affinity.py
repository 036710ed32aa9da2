"""The choices of one request's prompt are sent to the pods its first choice got."""

import asyncio

from gateway.sessions.affinity import PromptAffinity


async def _picks(affinity, keys, results):
    """Pick for every key at once; ``results`` are what the picker returns, in call order."""
    calls = []

    async def pick():
        result = results[len(calls)]
        calls.append(None)
        await asyncio.sleep(0.01)
        if isinstance(result, Exception):
            raise result
        return result

    async def one(key):
        try:
            return await affinity.pick(key, pick, lambda pods: pods[1] != "cooling")
        except RuntimeError as exc:
            return str(exc)

    return await asyncio.gather(*(one(k) for k in keys)), len(calls)


def test_choices_of_one_prompt_share_the_first_pick_and_others_pick_their_own():
    affinity = PromptAffinity()
    same = PromptAffinity.key("g1", [1, 2, 3], True)
    other_group = PromptAffinity.key("g2", [1, 2, 3], True)
    other_prompt = PromptAffinity.key("g1", [1, 2, 4], True)
    pods, calls = asyncio.run(_picks(affinity, [same, same, other_group, same, other_prompt],
                                     [("d1", "v1"), ("d2", "v2"), ("d3", "v3")]))
    assert pods == [("d1", "v1"), ("d1", "v1"), ("d2", "v2"), ("d1", "v1"), ("d3", "v3")]
    assert calls == 3
    for key in (same, same, other_group, same, other_prompt):
        affinity.release(key)
    assert len(affinity) == 0


def test_a_request_of_one_choice_is_not_pinned():
    affinity = PromptAffinity()
    key = PromptAffinity.key("", [1, 2, 3], True)
    assert key is None
    pods, calls = asyncio.run(_picks(affinity, [key, key], [("d1", "v1"), ("d2", "v2")]))
    assert pods == [("d1", "v1"), ("d2", "v2")] and calls == 2 and len(affinity) == 0


def test_a_failed_or_cooling_first_pick_lets_the_others_pick_again():
    affinity = PromptAffinity()
    key = PromptAffinity.key("g", [5], False)
    pods, calls = asyncio.run(_picks(affinity, [key, key],
                                     [RuntimeError("no verifier"), (None, "v2")]))
    assert pods == ["no verifier", (None, "v2")] and calls == 2
    affinity = PromptAffinity()
    pods, calls = asyncio.run(_picks(affinity, [key, key], [(None, "cooling"), (None, "v3")]))
    assert pods == [(None, "cooling"), (None, "v3")] and calls == 2
