"""The speculation memory on agentic workloads, through the gateway: target-only, the drafter
model, per-session prompt lookup (ngram) and the memory (suffix, suffix_then_model), side by side
in one run. Each mode gets a fresh local cluster (so each memory starts empty) and sends the same
requests one at a time, greedy, through the HTTP chat API; tokens/s is completion tokens over
wall time per workload.

Workloads (``cascade.bench.drafting.agent_workloads``, deterministic):

- **tool-calls**: an assistant with three tools (their JSON schemas in the system message, and
  three earlier exchanges that answered with a tool call, as an agent's history holds) answers
  eight user requests with a tool call each, then the same eight again (an agent loop re-running
  its tasks: retries, evaluation runs, several users asking alike).
- **code-edit**: a coding agent's edit loop: a 25-line Python file and five edit requests, each
  asking for the whole file back with one small change, each carrying the file as the previous
  answer left it.
- **files**: five different files, one edit each, the whole file asked back (nothing to replay).
- **extraction**: twenty notes about people, each extracted as JSON under one system prompt
  (structured answers alike in shape, different in content).
- **chat**: the benchmark's chat prompts, nothing repeated: the memory must not slow plain chat.

Modes: target-only, each drafting method by name, and the defaults (``auto``: each round from
whichever source pays, cascade.core.proposers.auto); ``predict`` is the defaults with the
code-edit and files requests sending the file as their predicted output (OpenAI's Predicted
Outputs).

    cascade bench memory [--target DIR --drafter DIR] [--max-tokens 64] [--modes target
        --modes suffix ...] [--workloads tool-calls ...]
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.bench.output import write_json
from cascade.bench.drafting.agent_workloads import (EDITS, FILE, FILES, REQUESTS, chat, extraction,
                                           tool_calls)
from cascade.bench.drafting.prediction_ceiling import perfect_rounds
from cascade.bench.compare.run import machine
from cascade.bench.compare.services import pinned_cluster
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings

WORKLOADS = ("tool-calls", "code-edit", "extraction", "files", "chat")


@dataclass(frozen=True)
class Mode:
    name: str
    fields: dict
    predict: bool = False
    """code-edit and files send the file being edited as the request's predicted output."""


MODES = {
    "target": Mode("target only (k=0)", {"num_draft_tokens": 0}),
    "model": Mode("drafter model (k=4)", {"num_draft_tokens": 4, "draft_method": "model"}),
    "ngram": Mode("prompt lookup, ngram (k=4)", {"num_draft_tokens": 4, "draft_method": "ngram"}),
    "suffix": Mode("memory: suffix", {"num_draft_tokens": 4, "draft_method": "suffix"}),
    "suffix_then_model": Mode("memory: suffix_then_model (k=4)",
                              {"num_draft_tokens": 4, "draft_method": "suffix_then_model"}),
    "default": Mode("defaults (auto)", {}),
    "predict": Mode("defaults + the file as prediction", {}, predict=True),
}


def _complete(http: httpx.Client, messages: list[dict], fields: dict, max_tokens: int
              ) -> tuple[str, Counter]:
    """(text, counts) of one streamed request: completion tokens, drafted and accepted
    tokens by what drafted them (from the rounds the gateway streams), and the prediction's
    tokens found in the completion and not (OpenAI's usage counts, with a prediction)."""
    body = {"model": http.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "cascade_rounds": True,
            "stream_options": {"include_usage": True}, **fields}
    text, counts = [], Counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            text.extend(c["delta"].get("content", "") for c in chunk.get("choices", []))
            details = (chunk.get("usage") or {}).get("completion_tokens_details") or {}
            for key in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
                counts[key] += details.get(key, 0)
            rounds = chunk.get("cascade")
            if rounds:
                counts["rounds"] += 1
                source = rounds.get("draft_source") or "target"
                counts["tokens"] += len(rounds["tokens"])
                counts[f"drafted:{source}"] += rounds["num_drafted"]
                counts[f"accepted:{source}"] += rounds["num_accepted"]
    return "".join(text), counts


def _edit(http: httpx.Client, text: str, edit: str, fields: dict, max_tokens: int,
          predict: bool, sent: list[tuple[str, str]]) -> tuple[str, Counter]:
    """One edit request: the whole file asked back (the file as its prediction with
    ``predict``, noted with the answer in ``sent``)."""
    ask = f"{edit} Return the whole file.\n```python\n{text}```"
    prediction = f"```python\n{text}```"
    predicted = {"prediction": {"type": "content", "content": prediction}} if predict else {}
    answer, counts = _complete(http, [{"role": "user", "content": ask}],
                               {**fields, **predicted}, max_tokens * 3)
    if predict:
        sent.append((prediction, answer))
    return answer, counts


def _perfect_rounds(http: httpx.Client, sent: list[tuple[str, str]]) -> int:
    """A perfect prediction drafter's rounds over the (prediction, answer) pairs, each answer
    re-tokenized (the tokens it was generated as, or nearly)."""
    return sum(perfect_rounds(_tokens(http, prediction), _tokens(http, answer))
               for prediction, answer in sent)


def _tokens(http: httpx.Client, text: str) -> list[int]:
    response = http.post("/tokenize", json={"model": http.model, "prompt": text,
                                            "add_special_tokens": False})
    response.raise_for_status()
    return response.json()["tokens"]


def run_workload(http: httpx.Client, name: str, fields: dict, max_tokens: int,
                 predict: bool = False) -> dict:
    counts, sent = Counter(), []
    started = time.perf_counter()
    if name == "code-edit":
        text = FILE
        for edit in EDITS:
            answer, more = _edit(http, text, edit, fields, max_tokens, predict, sent)
            text = answer.split("```python\n")[-1].split("```")[0] or text
            counts += more
    elif name == "files":
        for text, edit in FILES:
            counts += _edit(http, text, edit, fields, max_tokens, predict, sent)[1]
    else:
        conversations = {"tool-calls": tool_calls, "extraction": extraction,
                         "chat": chat}[name]()
        for i, messages in enumerate(conversations):
            if name == "tool-calls" and i == len(REQUESTS):  # the first pass is over
                counts["first_pass_s"] = time.perf_counter() - started
                counts["first_pass_tokens"] = counts["tokens"]
            counts += _complete(http, messages, fields, max_tokens)[1]
    elapsed = time.perf_counter() - started
    if sent:
        counts["perfect_rounds"] = _perfect_rounds(http, sent)
    return {"seconds": elapsed, "tokens_per_s": counts["tokens"] / elapsed, **counts}


def measure(target: Path, drafter: Path, workdir: Path, modes: list[str], max_tokens: int,
            workloads: tuple[str, ...] = WORKLOADS, schedule: str = "auto") -> dict:
    """Every workload in every mode, a fresh cluster per mode. ``schedule``: the requests'
    draft_schedule (the default, auto, or fixed)."""
    results: dict = {"machine": machine(), "max_tokens": max_tokens, "schedule": schedule,
                     "modes": {}}
    for key in modes:
        fields = {**MODES[key].fields, "draft_schedule": schedule}
        with pinned_cluster(target, drafter, workdir / key, gateway_args=()) as (cluster, _):
            with httpx.Client(base_url=cluster.http_url, timeout=600) as http:
                http.model = http.get("/v1/models").json()["data"][0]["id"]
                results["modes"][key] = {
                    w: run_workload(http, w, fields, max_tokens, MODES[key].predict)
                    for w in workloads}
    return results


def table(results: dict) -> Table:
    modes = results["modes"]
    workloads = list(next(iter(modes.values())))
    out = Table(title="Speculation memory through the gateway (tokens/s, x target-only)")
    out.add_column("mode")
    for w in workloads:
        out.add_column(w, justify="right")
    base = modes.get("target")
    for key, row in modes.items():
        cells = []
        for w in workloads:
            rate = row[w]["tokens_per_s"]
            ratio = f" ({rate / base[w]['tokens_per_s']:.2f}x)" if base else ""
            cells.append(f"{rate:.1f}{ratio}")
        out.add_row(MODES[key].name, *cells)
    return out


def passes_table(results: dict) -> Table:
    """tool-calls split into its first pass and the rerun, and how much of each mode's text
    was drafted and accepted, by what drafted it."""
    out = Table(title="tool-calls by pass (tokens/s), and accepted / drafted tokens by source")
    for column in ("mode", "first pass", "rerun", "accepted / drafted"):
        out.add_column(column, justify="right")
    for key, row in results["modes"].items():
        calls = row.get("tool-calls", {})
        first_s, first = calls.get("first_pass_s", 0), calls.get("first_pass_tokens", 0)
        rerun_s = calls.get("seconds", 0) - first_s
        sources = sorted({k.split(":")[1] for w in row.values() for k in w if ":" in k})
        drafted = ", ".join(
            f"{s} {sum(w.get('accepted:' + s, 0) for w in row.values())}/"
            f"{sum(w.get('drafted:' + s, 0) for w in row.values())}" for s in sources
            if s != "target")
        out.add_row(MODES[key].name, f"{first / first_s:.1f}" if first_s else "-",
                    f"{(calls.get('tokens', 0) - first) / rerun_s:.1f}" if rerun_s > 0 else "-",
                    drafted or "-")
    return out


def prediction_table(results: dict) -> Table:
    """Per workload sent with a prediction: how much of the completion the prediction held
    (OpenAI's usage counts), how much of it was drafted from the prediction and accepted, and
    the rounds the run took against the fewest a perfect drafter from the prediction needs
    (``cascade.bench.drafting.prediction_ceiling``)."""
    out = Table(title="Predicted outputs: completion tokens found in the prediction, drafted "
                      "from it, and rounds against a perfect prediction drafter's")
    for column in ("mode", "workload", "completion tokens", "in the prediction",
                   "prediction tokens not used", "accepted / drafted from it", "rounds",
                   "a perfect drafter's rounds"):
        out.add_column(column, justify="right")
    for key, row in results["modes"].items():
        for workload, w in row.items():
            found = w.get("accepted_prediction_tokens", 0)  # counters drop zeros
            unused = w.get("rejected_prediction_tokens", 0)
            if found or unused:
                out.add_row(MODES[key].name, workload, str(w["tokens"]), str(found), str(unused),
                            f"{w.get('accepted:prediction', 0)}/"
                            f"{w.get('drafted:prediction', 0)}", str(w.get("rounds", "-")),
                            str(w.get("perfect_rounds", "-")))
    return out


ModeName = Literal["target", "model", "ngram", "suffix", "suffix_then_model", "default",
                   "predict"]
WorkloadName = Literal["tool-calls", "code-edit", "extraction", "files", "chat"]


class MemorySettings(BaseModel):
    """The speculation memory on agentic workloads through the gateway: tokens/s per mode and
    workload, each mode on a fresh local cluster (greedy, one request at a time)."""

    models: PairSettings = PairSettings()
    workdir: Path = Field(Path("runs/memory"), description="Where the clusters' logs go.")
    max_tokens: int = Field(64, ge=1, description="Tokens per request (three times as many for "
                            "an edit, which asks for the whole file back).")
    modes: list[ModeName] = Field(list(MODES), description="Modes (repeat the flag): target, "
                                  "model, ngram, suffix, suffix_then_model, default, predict.")
    workloads: list[WorkloadName] = Field(list(WORKLOADS), description="Workloads (repeat the "
                                          "flag): tool-calls, code-edit, extraction, files, "
                                          "chat.")
    schedule: Literal["auto", "fixed"] = Field("auto", description="The requests' "
                                               "draft_schedule: auto or fixed.")
    out: Path | None = Field(None, description="Also write the results as JSON here.")


def run(settings: MemorySettings) -> dict:
    """Measure every mode and print the tables; the results."""
    s = settings
    target, drafter = s.models.folders()
    results = measure(target, drafter, s.workdir, list(s.modes), s.max_tokens,
                      tuple(s.workloads), s.schedule)
    console = Console(width=140)
    console.print(table(results))
    console.print(passes_table(results))
    if any(MODES[key].predict for key in results["modes"]):
        console.print(prediction_table(results))
    write_json(s.out, results)
    return results


if __name__ == "__main__":
    settings_command(MemorySettings, run)()
