"""Structured outputs under speculation, in one process on the default pair: for a set of JSON
schemas, greedy generation with and without the grammar, on the target alone and with the
model drafter (k = 4, its q shaped by the grammar), side by side in one run.

    cascade bench structured [--max-tokens 96] [--k 4] [--dtype float32] [--pair tiny]

Prints tokens/s, committed tokens per target pass, the drafter's acceptance and the tokens at
positions the grammar forced (and how many of those the verifier filled in without a pass:
jump-forward) per mode, and checks that every output made under a grammar that finished parses
and validates against its schema (and that speculation under a grammar emits the target's own
masked tokens). ``--pair tiny`` runs the tiny random-weight pair instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import jsonschema
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from cascade.bench.compare.run import machine
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.protocol.grammar import Grammar
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.stats import SpecStats
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                             "maximum": 120},
        "city": {"type": "string", "maxLength": 40}},
        "required": ["name", "age", "city"], "additionalProperties": False},
    "product": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 60}, "price": {"type": "number"},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
        "required": ["title", "price", "in_stock", "tags"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "event": {"type": "string", "maxLength": 50},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "attendees": {"type": "integer", "minimum": 1, "maximum": 10000},
        "kind": {"enum": ["meeting", "party", "conference", "concert"]}},
        "required": ["event", "date", "attendees", "kind"], "additionalProperties": False},
}
"""A test set of schemas (short objects, each completed well within the token budget)."""

PROMPTS = {
    "person": "Describe a fictional person as JSON with their name, age and city.",
    "product": "Give a product from an online shop as JSON: title, price, stock, tags.",
    "event": "Describe an upcoming event as JSON: its name, date, attendees and kind.",
}


def modes(k: int) -> tuple[tuple[str, int, bool], ...]:
    """(name, k, with the grammar) of each mode."""
    return (("target alone", 0, False), ("target alone + grammar", 0, True),
            (f"k={k}", k, False), (f"k={k} + grammar", k, True))


@dataclass
class Tally:
    stats: SpecStats = field(default_factory=SpecStats)
    seconds: float = 0.0
    tokens: int = 0
    valid: int = 0
    finished: int = 0


def run_mode(target: ModelRunner, drafter: ModelRunner, prompt: list[int], schema: dict,
             mode: tuple[str, int, bool], max_tokens: int, tally: Tally) -> list[int]:
    _, k, with_grammar = mode
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=max_tokens, stop_token_ids=(eos,),
                            grammar=Grammar.json_schema(schema) if with_grammar else None)
    result = generate(target, prompt, params, drafter if k else None,
                      DraftConfig(num_draft_tokens=k))
    tally.stats, tally.seconds = tally.stats + result.stats, tally.seconds + result.elapsed_s
    tally.tokens += len(result.tokens)
    if with_grammar and result.tokens and result.tokens[-1] == eos:
        tally.finished += 1
        text = target.tokenizer.decode(result.tokens[:-1])
        try:
            jsonschema.validate(json.loads(text), schema)
            tally.valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return result.tokens


def measure(target: ModelRunner, drafter: ModelRunner, max_tokens: int, k: int
            ) -> dict[str, Tally]:
    tallies = {m[0]: Tally() for m in modes(k)}
    for name, schema in SCHEMAS.items():
        prompt = chat_prompts_ids(target.tokenizer, [PROMPTS[name]])[0]
        outputs = {m[0]: run_mode(target, drafter, prompt, schema, m, max_tokens,
                                  tallies[m[0]]) for m in modes(k)}
        masked = [outputs[m[0]] for m in modes(k) if m[2]]
        if masked[0] != masked[1]:
            raise AssertionError(f"{name}: speculation under the grammar changed the output")
        Console(stderr=True).print(f"{name}: done")
    return tallies


def report(tallies: dict[str, Tally], dtype: str) -> None:
    table = Table(title=f"structured outputs, {len(SCHEMAS)} JSON schemas, greedy, "
                        f"{dtype} target")
    for column in ("mode", "tokens/s", "vs target alone + grammar", "tokens / pass",
                   "acceptance", "forced / filled", "valid / finished"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    base = tallies["target alone + grammar"]
    for name, t in tallies.items():
        rate = t.tokens / t.seconds if t.seconds else 0.0
        base_rate = base.tokens / base.seconds if base.seconds else 1.0
        passes = t.stats.num_target_passes or 1
        table.add_row(name, f"{rate:.2f}", f"{rate / base_rate:.2f}x",
                      f"{t.stats.num_emitted_tokens / passes:.2f}",
                      f"{t.stats.acceptance_rate:.2f}",
                      f"{t.stats.num_forced_tokens}/{t.stats.num_filled_tokens}",
                      f"{t.valid}/{t.finished}" if "grammar" in name else "-")
    console = Console()
    console.print(table)
    console.print(machine())


class StructuredSettings(BaseModel):
    """Structured outputs under speculation: greedy generation for a set of JSON schemas with
    and without the grammar, on the target alone and with the model drafter."""

    models: PairSettings = PairSettings()
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="The target's dtype: float32, bfloat16, float16 or auto.")
    max_tokens: int = Field(96, ge=1, description="Tokens generated per schema.")
    k: int = Field(4, ge=1, le=32, description="Drafted tokens per round of the drafting "
                   "modes.")


def run(settings: StructuredSettings) -> None:
    """Run every mode on every schema and print the table."""
    s = settings
    target_dir, drafter_dir = s.models.folders()
    target = ModelRunner.load(ModelSpec(str(target_dir), dtype=s.dtype))
    drafter = ModelRunner.load(ModelSpec(str(drafter_dir)))
    report(measure(target, drafter, s.max_tokens, s.k), s.dtype)


if __name__ == "__main__":
    settings_command(StructuredSettings, run)()
