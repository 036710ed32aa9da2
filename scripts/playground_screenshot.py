"""Screenshot of the playground after a compare run, for docs/playground.png.

    .venv/bin/cascade up &   # then:
    .venv/bin/python scripts/playground_screenshot.py http://127.0.0.1:8000 docs/playground.png
"""

from __future__ import annotations

import shutil
import sys

from playwright.sync_api import sync_playwright

PROMPT = "def fibonacci(n):"


def compare(page, base_url: str, prompt: str, max_tokens: int, mode: str | None = None) -> None:
    """A greedy Compare run in the playground at ``base_url``, until the speedup shows."""
    page.goto(f"{base_url}/playground/")
    page.wait_for_selector("body[data-ready]")
    if mode:
        page.select_option("#mode", mode)
    page.fill("#prompt", prompt)
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.click("#compare")
    page.wait_for_selector("#speedup:not([hidden])", timeout=300_000)


def main(base_url: str, out: str, max_tokens: int = 48) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        compare(page, base_url, PROMPT, max_tokens, mode="completion")
        page.locator("#pane-speculative .round").nth(2).hover()
        page.screenshot(path=out, full_page=True)
        print(page.inner_text("#speedup"))
        browser.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
