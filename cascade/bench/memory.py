"""The speculation memory on agentic workloads, through the gateway: target-only, the drafter
model, per-session prompt lookup (ngram) and the memory (suffix, suffix_then_model), side by side
in one run. Each mode gets a fresh local cluster (so each memory starts empty) and sends the same
requests one at a time, greedy, through the HTTP chat API; tokens/s is completion tokens over
wall time per workload.

Workloads (built here, deterministic):

- **tool-calls**: an assistant with three tools (their JSON schemas in the system message, and
  three earlier exchanges that answered with a tool call, as an agent's history holds) answers
  eight user requests with a tool call each, then the same eight again (an agent loop re-running
  its tasks: retries, evaluation runs, several users asking alike).
- **code-edit**: a coding agent's edit loop: a 25-line Python file and five edit requests, each
  asking for the whole file back with one small change, each carrying the file as the previous
  answer left it.
- **files**: five different files, one edit each, the whole file asked back (nothing to replay:
  ``cascade.bench.edit_files``).
- **extraction**: twenty notes about people, each extracted as JSON under one system prompt
  (structured answers alike in shape, different in content).
- **chat**: the benchmark's chat prompts, nothing repeated: the memory must not slow plain chat.

Modes: target-only, each drafting method by name, and the defaults (``auto``: each round from
whichever source pays, cascade.core.proposers.auto); ``predict`` is the defaults with the
code-edit and files requests sending the file as their predicted output (OpenAI's Predicted
Outputs).

python -m cascade.bench.memory --target DIR --drafter DIR [--max-tokens 64] [--modes ...]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from cascade.bench.edit_files import FILES
from cascade.bench.prompts import DOMAINS
from cascade.bench.run import machine
from cascade.bench.services import pinned_cluster

TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}},
    {"name": "search_flights", "description": "Flights between two airports on a date.",
     "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                     "destination": {"type": "string"},
                                                     "date": {"type": "string"}},
                    "required": ["origin", "destination", "date"]}},
    {"name": "create_event", "description": "Add an event to the user's calendar.",
     "parameters": {"type": "object", "properties": {"title": {"type": "string"},
                                                     "start": {"type": "string"},
                                                     "minutes": {"type": "integer"}},
                    "required": ["title", "start"]}},
]
SYSTEM = ("You are an assistant that answers only with one tool call, as JSON: "
          '{"name": <tool name>, "arguments": {...}}. Tools:\n'
          + "\n".join(json.dumps(tool) for tool in TOOLS))
EXAMPLES = [
    ("What's the weather in Rome?",
     {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}),
    ("Find flights from AMS to BER on 2025-02-01.",
     {"name": "search_flights", "arguments": {"origin": "AMS", "destination": "BER",
                                              "date": "2025-02-01"}}),
    ("Add 'lunch with Ana' on 2025-02-03 at 12:30 for 60 minutes.",
     {"name": "create_event", "arguments": {"title": "lunch with Ana",
                                            "start": "2025-02-03T12:30", "minutes": 60}}),
]
REQUESTS = [
    "What's the weather in Paris?", "Find flights from SFO to JFK on 2025-03-14.",
    "Put 'dentist' on my calendar for 2025-03-20 at 09:00, 30 minutes.",
    "Is it cold in Oslo right now? Use fahrenheit.", "Flights from LHR to CDG on 2025-04-02?",
    "Schedule 'team sync' at 2025-03-21 14:00 for 45 minutes.", "Weather in Tokyo, please.",
    "Search flights from BOS to ORD on 2025-05-09.",
]
FILE = '''import json
from pathlib import Path


def load_config(path):
    with open(path) as f:
        return json.load(f)


def save_config(path, config):
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def merge(base, override):
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result
'''
EDITS = ["Add type hints to load_config.", "Rename `f` to `handle` in save_config.",
         "Make save_config sort the keys.", "Add a docstring to merge.",
         "Use Path.read_text in load_config."]


EXTRACT_SYSTEM = ("Extract the person in the user's note as JSON with the keys name, age, "
                  "city and job, nothing else. Example: "
                  '{"name": "Ana Silva", "age": 31, "city": "Lisbon", "job": "nurse"}')
NAMES = ["Ben Okafor", "Chloe Martin", "Dev Patel", "Eva Novak", "Finn Berg", "Grace Liu",
         "Hugo Rossi", "Ines Costa", "Jon Park", "Kira Sato"]
CITIES = ["Oslo", "Lyon", "Pune", "Graz", "Turku", "Xi'an", "Bari", "Porto", "Busan", "Osaka"]
JOBS = ["teacher", "plumber", "chemist", "pilot", "baker", "lawyer", "nurse", "farmer",
        "editor", "welder"]

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


def tool_calls() -> list[list[dict]]:
    history = [{"role": "system", "content": SYSTEM}]
    for question, call in EXAMPLES:
        history += [{"role": "user", "content": question},
                    {"role": "assistant", "content": json.dumps(call)}]
    return [history + [{"role": "user", "content": r}] for r in REQUESTS * 2]


def extraction() -> list[list[dict]]:
    """Twenty notes about people, one JSON extraction each, under one system prompt."""
    notes = [f"Met {NAMES[i % 10]} yesterday, {24 + 3 * i % 40} years old, a "
             f"{JOBS[(3 * i) % 10]} from {CITIES[(7 * i) % 10]}." for i in range(20)]
    return [[{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": n}]
            for n in notes]


def chat() -> list[list[dict]]:
    prompts = next(d for d in DOMAINS if d.name == "chat").prompts
    return [[{"role": "user", "content": p}] for p in prompts]


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
                source = rounds.get("source") or "target"
                counts["tokens"] += len(rounds["tokens"])
                counts[f"drafted:{source}"] += rounds["num_drafted"]
                counts[f"accepted:{source}"] += rounds["num_accepted"]
    return "".join(text), counts


def _edit(http: httpx.Client, text: str, edit: str, fields: dict, max_tokens: int,
          predict: bool) -> tuple[str, Counter]:
    """One edit request: the whole file asked back (the file as its prediction with
    ``predict``)."""
    ask = f"{edit} Return the whole file.\n```python\n{text}```"
    predicted = ({"prediction": {"type": "content", "content": f"```python\n{text}```"}}
                 if predict else {})
    return _complete(http, [{"role": "user", "content": ask}], {**fields, **predicted},
                     max_tokens * 3)


def run_workload(http: httpx.Client, name: str, fields: dict, max_tokens: int,
                 predict: bool = False) -> dict:
    counts = Counter()
    started = time.perf_counter()
    if name == "code-edit":
        text = FILE
        for edit in EDITS:
            answer, more = _edit(http, text, edit, fields, max_tokens, predict)
            text = answer.split("```python\n")[-1].split("```")[0] or text
            counts += more
    elif name == "files":
        for text, edit in FILES:
            counts += _edit(http, text, edit, fields, max_tokens, predict)[1]
    else:
        conversations = {"tool-calls": tool_calls, "extraction": extraction,
                         "chat": chat}[name]()
        for i, messages in enumerate(conversations):
            if name == "tool-calls" and i == len(REQUESTS):  # the first pass is over
                counts["first_pass_s"] = time.perf_counter() - started
                counts["first_pass_tokens"] = counts["tokens"]
            counts += _complete(http, messages, fields, max_tokens)[1]
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "tokens_per_s": counts["tokens"] / elapsed, **counts}


def run(target: Path, drafter: Path, workdir: Path, modes: list[str], max_tokens: int,
        workloads: tuple[str, ...] = WORKLOADS, schedule: str = "auto") -> dict:
    """``schedule``: the requests' draft_schedule (the default, auto, or fixed)."""
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
    (OpenAI's usage counts) and how much of it was drafted from the prediction and accepted."""
    out = Table(title="Predicted outputs: completion tokens found in the prediction, and "
                      "drafted from it")
    for column in ("mode", "workload", "completion tokens", "in the prediction",
                   "prediction tokens not used", "accepted / drafted from it"):
        out.add_column(column, justify="right")
    for key, row in results["modes"].items():
        for workload, w in row.items():
            if "accepted_prediction_tokens" in w and (w["accepted_prediction_tokens"]
                                                      or w["rejected_prediction_tokens"]):
                out.add_row(MODES[key].name, workload, str(w["tokens"]),
                            str(w["accepted_prediction_tokens"]),
                            str(w["rejected_prediction_tokens"]),
                            f"{w.get('accepted:prediction', 0)}/"
                            f"{w.get('drafted:prediction', 0)}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("runs/memory"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--schedule", default="auto", choices=("auto", "fixed"))
    parser.add_argument("--out", type=Path, help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    results = run(args.target, args.drafter, args.workdir, args.modes, args.max_tokens,
                  tuple(args.workloads), args.schedule)
    console = Console(width=140)
    console.print(table(results))
    console.print(passes_table(results))
    if any(MODES[key].predict for key in results["modes"]):
        console.print(prediction_table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
