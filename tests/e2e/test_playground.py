"""The playground page in a real browser (Debian's chromium driven by Playwright) against a real
tiny cluster: the page's coloured tokens must agree with the stream it received."""

from __future__ import annotations

import json
import os
import shutil

import pytest

async_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")

CHROMIUM = os.environ.get("CASCADE_CHROMIUM") or next(
    (path for path in map(shutil.which, ("chromium", "chromium-browser")) if path), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium executable (apt-get install chromium, or set "
                             "CASCADE_CHROMIUM): the browser tests need one")

KINDS = ("accepted", "recovered", "bonus", "target")


@pytest.fixture
async def page(cluster):
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{cluster.http_url}/playground/")
        await page.wait_for_selector("body[data-ready]")
        yield page
        await browser.close()


def stream_rounds(body: bytes) -> list[dict]:
    """The ``cascade`` objects of an SSE body, checking each chunk parses as JSON."""
    rounds = []
    for event in body.decode().split("\n\n"):
        lines = [line for line in event.split("\n") if line.startswith("data: ")]
        data = lines[0].removeprefix("data: ") if lines else ""  # an id: line may come first
        if data and data != "[DONE]":
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            if "cascade" in chunk:
                rounds.append(chunk["cascade"])
    return rounds


async def fill_settings(page, prompt: str, max_tokens: int, schedule: str = "fixed",
                        **fields: str) -> None:
    await page.fill("#prompt", prompt)
    await page.fill("#max_tokens", str(max_tokens))
    await page.select_option("#draft_schedule", schedule)
    for name, value in fields.items():
        await page.fill(f"#{name}", value)


async def kind_counts(pane) -> dict[str, int]:
    return {kind: await pane.locator(f".tok.{kind}").count() for kind in KINDS}


async def figure(pane, name: str) -> str:
    return await pane.locator(f'[data-figure="{name}"] dd').inner_text()


async def test_a_run_streams_coloured_rounds(page, tmp_path):
    await fill_settings(page, "Count with me: one two three", 24, temperature="0",
                        num_draft_tokens="4")
    await page.select_option("#draft_method", "model")  # every block the model's k
    async with page.expect_response("**/v1/chat/completions") as response_info:
        await page.click("#run")
    pane = page.locator("#pane-speculative")
    await page.wait_for_selector("#pane-speculative[data-done]")
    rounds = stream_rounds(await (await response_info.value).body())

    assert rounds, "the stream carried no rounds"
    assert rounds[0]["num_drafted"] == 4
    assert all(len(r["drafted"]) == r["num_drafted"] for r in rounds)
    counts = await kind_counts(pane)
    assert counts["accepted"] == sum(r["num_accepted"] for r in rounds)
    for kind in ("recovered", "bonus"):
        assert counts[kind] == sum(t["kind"] == kind for r in rounds for t in r["tokens"])
    assert counts["accepted"] + counts["recovered"] + counts["bonus"] == sum(
        len(r["tokens"]) for r in rounds) == int(await figure(pane, "tokens"))
    assert await pane.locator(".round").count() == len(rounds)
    drafted, accepted = (sum(r[key] for r in rounds) for key in ("num_drafted", "num_accepted"))
    assert await figure(pane, "acceptance rate") == f"{accepted / drafted:.2f}"
    text = "".join(t["text"] for r in rounds for t in r["tokens"])
    assert await pane.locator(".output").inner_text() == text

    await pane.locator(".round").first.hover()
    info = page.locator("#round-info")
    assert await info.is_visible()
    first = rounds[0]
    assert f"accepted {first['num_accepted']} of {first['num_drafted']}" in await info.inner_text()
    assert first["draft_source"] == "model" and "drafted by: the drafter model" in await info.inner_text()
    memory_share = sum(r["draft_source"] == "memory" for r in rounds) * 100 // len(rounds)
    assert await figure(pane, "rounds from memory") == f"{memory_share} %"
    undrafted = pane.locator('[data-figure="rounds at 0 drafts"]')
    assert "goodput planner" in await undrafted.get_attribute("title")  # why there are any
    chart = pane.locator(".chart")  # a bar per round part, axes labelled, a legend
    assert await chart.locator("rect").count() == sum(
        bool(r["num_accepted"]) + (len(r["tokens"]) > r["num_accepted"]) for r in rounds)
    assert await chart.locator(".axis").count() == 2
    assert f"round (1-{len(rounds)})" in await chart.locator(".axis-label").all_text_contents()
    legend = await pane.locator(".chart-legend li").all_inner_texts()
    assert legend == ["drafted and accepted", "the verifier's token after a draft",
                      "decoded by the verifier alone (no draft)"]

    shot = tmp_path / "playground.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


async def test_compare_shows_the_speedup_and_the_same_greedy_text(page):
    await fill_settings(page, "The weather today is", 20, temperature="0")
    await page.click("#compare")
    await page.wait_for_selector("#speedup:not([hidden])", timeout=120_000)
    speculative, target = page.locator("#pane-speculative"), page.locator("#pane-target")
    assert await target.is_visible()
    speedup = float(await page.locator("#speedup").get_attribute("data-speedup"))
    assert speedup > 0 and "Speedup over the target alone" in await page.inner_text("#speedup")
    target_counts = await kind_counts(target)
    assert target_counts["target"] == int(await figure(target, "tokens")) > 0
    assert target_counts["accepted"] == target_counts["recovered"] == 0
    # greedy speculative decoding is exact: both panes show the same text
    assert await speculative.locator(".output").inner_text() == \
        await target.locator(".output").inner_text()


async def test_a_bad_setting_shows_the_servers_message(page):
    await fill_settings(page, "Hello", 8, temperature="5")
    async with page.expect_response("**/v1/chat/completions") as response_info:
        await page.click("#run")
    response = await response_info.value
    assert response.status == 400
    message = (await response.json())["error"]["message"]
    error = page.locator("#error")
    await error.wait_for(state="visible")
    assert "temperature" in message and message in await error.inner_text()


async def test_narrow_window_has_no_sideways_scroll(page):
    await page.set_viewport_size({"width": 420, "height": 800})
    await fill_settings(page, "Hi", 6)
    await page.click("#compare")
    await page.wait_for_selector("#speedup:not([hidden])", timeout=120_000)
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    boxes = [await page.locator(f"#{pane}").bounding_box()
             for pane in ("pane-speculative", "pane-target")]
    assert boxes[1]["y"] >= boxes[0]["y"] + boxes[0]["height"]  # stacked, not side by side
