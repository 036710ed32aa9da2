"""The Python side of scripts/first-hour.sh: what a new user runs against a running gateway, each
step a subcommand that exits 0 when it did what the README says.

    readme-commands KIND HTTP_URL   the README's "Using it" commands of one kind (curl, lm-eval),
                                    as bash, with its localhost:8000 replaced by HTTP_URL
    check-completion                a /v1/completions answer on stdin has a non-empty text
    openai HTTP_URL MODEL           the official client: a completion, a chat, a stream
    playground HTTP_URL SHOT        Run and Compare in Chromium; a screenshot at SHOT
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_ADDRESS = re.compile(r"(https?://)?localhost:8000")


def readme_commands(kind: str, http_url: str) -> str:
    """The commands of the README's first bash block under "## Using it" that start with
    ``curl``/``MODEL=`` (kind curl) or run ``lm-eval`` (kind lm-eval), as written there, but
    for the gateway at ``http_url``."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    commands, pending = [], ""
    for line in block.splitlines():  # a command goes on over lines that end in a backslash
        pending += line
        if not line.endswith("\\"):
            commands.append(pending)
            pending = ""
        else:
            pending += "\n"
    starts = {"curl": ("curl ", "MODEL="), "lm-eval": (".venv/bin/lm-eval ",)}[kind]
    chosen = [command for command in commands if command.startswith(starts)]
    if not chosen:
        raise SystemExit(f"the README's 'Using it' block has no {kind} command")
    return "\n".join(README_ADDRESS.sub(http_url, c) for c in chosen)


def check_completion(answer: str) -> None:
    body = json.loads(answer)
    text = body["choices"][0]["text"]
    assert text and body["usage"]["completion_tokens"] >= 1, body
    print(f"completion: {text!r}")


def openai_steps(http_url: str, model: str) -> None:
    """A completion, a chat completion and the same chat streamed (greedy: the same text)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{http_url}/v1", api_key="unused", timeout=120)
    completion = client.completions.create(model=model, prompt="def main():", max_tokens=16,
                                           temperature=0)
    assert completion.choices[0].text and completion.usage.completion_tokens >= 1, completion
    print(f"completion: {completion.choices[0].text!r}")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                          temperature=0)
    text = chat.choices[0].message.content
    assert text and chat.choices[0].finish_reason in ("stop", "length"), chat
    print(f"chat: {text!r}")
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream
                       if chunk.choices)
    assert streamed == text, f"stream {streamed!r} != chat {text!r}"
    print(f"stream: {streamed!r} (the chat's text)")


def playground(http_url: str, shot: str) -> None:
    """Compare in the playground: both panes finish with the same greedy text and a speedup."""
    from playwright.sync_api import sync_playwright

    from playground_screenshot import compare  # beside this script

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            compare(page, http_url, "The weather today is", 16)
            texts = [page.locator(f"#pane-{pane} .output").inner_text()
                     for pane in ("speculative", "target")]
            assert texts[0] and texts[0] == texts[1], texts
            page.screenshot(path=shot, full_page=True)
            print(f"text: {texts[0]!r}; {page.inner_text('#speedup')}; screenshot {shot}")
        finally:
            browser.close()


if __name__ == "__main__":
    step, args = sys.argv[1], sys.argv[2:]
    if step == "readme-commands":
        print(readme_commands(*args))
    elif step == "check-completion":
        check_completion(sys.stdin.read())
    elif step == "openai":
        openai_steps(*args)
    elif step == "playground":
        playground(*args)
    else:
        raise SystemExit(f"unknown step {step!r}; see {__file__}'s docstring")
