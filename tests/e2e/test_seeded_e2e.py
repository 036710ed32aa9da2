"""A seeded sampled request reproduces its text with default settings: the same text alone and
among eight at once (the default auto schedule drafts differently under load; the keyed rule
makes the text depend on the prompt, parameters and seed alone)."""

import asyncio

import httpx

BODY = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0.9,
        "seed": 4321}


async def test_a_seeded_request_gives_one_text_alone_and_among_eight(cluster):
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=120) as http:
        async def text(body):
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["text"]

        alone = [await text(BODY) for _ in range(2)]
        crowd = await asyncio.gather(*(text(BODY) for _ in range(8)))
        other = await text({**BODY, "seed": 1})
    assert len(set(alone + crowd)) == 1 and alone[0]
    assert other != alone[0]  # the seed, not the prompt alone, decides
