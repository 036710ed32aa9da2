"""Time to first token of a multi-turn chat through the gateway: each turn after the first
against a cold request of the same length, side by side in one run.

    cascade bench prefix-chat [--target DIR --drafter DIR] [--turns 4] [--max-tokens 48]
        [--conversations 2]

A local cluster (verifier and drafter pinned to a core each, real Redis); each conversation
sends its turns one after another through the HTTP chat API (streamed, greedy), each turn
carrying the whole history with the previous answers. After every turn the same messages are
sent *cold*: a different first line of the system message, so no prefix of it was computed
before (one or two tokens longer). Time to first token is the time until the first streamed
content. Modes: target only (k = 0) and the default request (the drafter drafting).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from cascade.bench.output import write_json
from cascade.bench.drafting.agent_workloads import SYSTEM
from cascade.bench.compare.run import machine
from cascade.bench.compare.services import pinned_cluster
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings

TOPICS = [
    ["I'm planning a trip to Lisbon in March. What should I pack?",
     "How many days would you spend there?", "What about a day trip from the city?",
     "Summarize the plan in three bullet points."],
    ["Explain what a hash table is.", "How are collisions handled?",
     "When would you use a tree instead?", "Give a one-line summary of the trade-off."],
]
GUIDE = ("You are a careful assistant. Answer briefly and concretely. When the user asks for "
         "a plan, give one; when they ask for a summary, keep it short. Earlier tool "
         "descriptions, kept for reference:\n" + SYSTEM)
MODES = {"target only (k=0)": {"num_draft_tokens": 0}, "default request": {}}


def first_token(http: httpx.Client, messages: list[dict], fields: dict, max_tokens: int
                ) -> tuple[float, str]:
    """(seconds to the first content, the answer) of one streamed request."""
    body = {"model": http.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, **fields}
    started, first, text = time.perf_counter(), None, []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                content = choice["delta"].get("content")
                if content:
                    first = first or time.perf_counter() - started
                    text.append(content)
    return first or time.perf_counter() - started, "".join(text)


def conversation(http: httpx.Client, turns: list[str], fields: dict, max_tokens: int,
                 nonce: int) -> list[tuple[float, float]]:
    """(warm, cold) time to first token of each turn."""
    history, out = [{"role": "system", "content": GUIDE}], []
    for i, turn in enumerate(turns):
        history.append({"role": "user", "content": turn})
        warm, answer = first_token(http, history, fields, max_tokens)
        cold_system = {"role": "system", "content": f"Session {nonce}-{i}.\n{GUIDE}"}
        cold, _ = first_token(http, [cold_system] + history[1:], fields, max_tokens)
        out.append((warm, cold))
        history.append({"role": "assistant", "content": answer})
    return out


def measure(target: Path, drafter: Path, workdir: Path, turns: int, max_tokens: int,
            conversations: int) -> dict:
    """Every mode's conversations on one local cluster: (warm, cold) per turn."""
    results = {"machine": machine(), "modes": {}}
    with pinned_cluster(target, drafter, workdir) as (cluster, _):
        with httpx.Client(base_url=cluster.http_url, timeout=600) as http:
            http.model = http.get("/v1/models").json()["data"][0]["id"]
            first_token(http, [{"role": "user", "content": "Hello"}], {}, 4)  # warm up
            for m, (name, fields) in enumerate(MODES.items()):
                results["modes"][name] = [
                    conversation(http, TOPICS[c % len(TOPICS)][:turns], fields, max_tokens,
                                 1000 * m + c) for c in range(conversations)]
    return results


def report(results: dict, turns: int) -> None:
    print(results["machine"])
    print("| mode | turn | time to first token, warm (s) | cold, same length (s) | warm/cold |")
    print("|---|---|---|---|---|")
    for name, runs in results["modes"].items():
        for t in range(turns):
            warm = statistics.median(run[t][0] for run in runs)
            cold = statistics.median(run[t][1] for run in runs)
            print(f"| {name} | {t + 1} | {warm:.3f} | {cold:.3f} | {warm / cold:.2f} |")


class PrefixChatSettings(BaseModel):
    """Time to first token of a multi-turn chat through the gateway: each turn after the first
    against a cold request of the same length (medians over the conversations)."""

    models: PairSettings = PairSettings()
    workdir: Path = Field(Path("runs/prefix-chat"), description="Where the cluster's logs go.")
    turns: int = Field(4, ge=1, le=min(len(t) for t in TOPICS), description="Turns per "
                       "conversation.")
    max_tokens: int = Field(48, ge=1, description="Tokens per answer.")
    conversations: int = Field(2, ge=1, description="Conversations per mode (their topics "
                               "taken in turn).")
    out: Path | None = Field(None, description="Also write the results as JSON here.")


def run(settings: PrefixChatSettings) -> dict:
    """Measure both modes and print the table; the results."""
    s = settings
    target, drafter = s.models.folders()
    results = measure(target, drafter, s.workdir, s.turns, s.max_tokens, s.conversations)
    report(results, s.turns)
    write_json(s.out, results)
    return results


if __name__ == "__main__":
    settings_command(PrefixChatSettings, run)()
