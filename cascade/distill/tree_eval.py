"""Chains against token trees in one process: what each commits per target pass and what that
buys in tokens per second, on the default pair (or any pair), side by side in one run.

    python -m cascade.distill.tree_eval --domain held-out --max-tokens 64 --prompts 12 \\
        --config 0 --config 4 --config 4:16:4 --config 8:64:8 [--dtype bfloat16] \\
        [--temperature 0.7 --rule keyed|recursive]

The drafter may be a feature drafter (``--drafter cascade/assets/smollm2-135m-feature-drafter``:
it reads the target's features; its trees too are grown one drafter pass per depth).
A config is ``k`` (a chain of k; 0: the target alone), ``k:nodes:branching`` (a tree of
depth k) or ``k:nodes:branching:confidence`` (a tree grown by CAPE's confidence-aware
expansion). Greedy by default: every config must emit the same tokens (checked, not assumed);
``--temperature T`` samples, with the position-keyed rule (every config must then also emit
the same tokens for one seed) or the recursive rule (``--rule recursive``: sampled trees
verified against q; chains get speculative sampling).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from cascade.bench.prompts import bench_prompts, domain_names
from cascade.bench.compare.run import machine
from cascade.distill.prompts import prompt_set
from cascade.protocol.chat import chat_prompts_ids
from cascade.core.features.feature_runner import load_model
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.stats import SpecStats


@dataclass
class Tally:
    """One config over every prompt: the verifier's counters (passes, drafted nodes, emitted
    tokens) and the loop's times."""

    stats: SpecStats = field(default_factory=SpecStats)
    seconds: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0


def parse_config(text: str) -> DraftConfig:
    """``k``, ``k:nodes:branching`` or ``k:nodes:branching:expansion`` (dynamic, confidence)."""
    parts = text.split(":")
    if len(parts) not in (1, 3, 4) or not all(p.isdigit() for p in parts[:3]):
        raise argparse.ArgumentTypeError(f"a config is k, k:nodes:branching or "
                                         f"k:nodes:branching:expansion, got {text!r}")
    k, nodes, branching = (int(p) for p in parts[:3]) if len(parts) > 1 else (int(text), 0, 4)
    expansion = parts[3] if len(parts) == 4 else "dynamic"
    try:
        return DraftConfig(num_draft_tokens=k, tree_nodes=nodes, tree_branching=branching,
                           tree_expansion=expansion)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def label(config: DraftConfig) -> str:
    if config.num_draft_tokens == 0:
        return "target alone"
    if not config.tree_nodes:
        return f"chain k={config.num_draft_tokens}"
    if config.tree_expansion == "confidence":
        return f"CAPE tree: depth {config.num_draft_tokens}, {config.tree_nodes} nodes"
    return (f"tree: depth {config.num_draft_tokens}, {config.tree_nodes} nodes, "
            f"branching {config.tree_branching}")


def run_one(target, drafter, prompt: list[int], params, config, policy, tally: Tally
            ) -> list[int]:
    result = generate(target, prompt, params, drafter if config.num_draft_tokens else None,
                      config, policy)
    tally.stats = tally.stats + result.stats
    tally.seconds += result.elapsed_s
    tally.draft_s += result.timing.draft_s
    tally.verify_s += result.timing.verify_s
    return result.tokens


def measure(args) -> list[tuple[DraftConfig, Tally]]:
    target = ModelRunner.load(ModelSpec(str(args.target), dtype=args.dtype))
    drafter = load_model(ModelSpec(str(args.drafter)), str(args.target))
    if args.domain == "held-out":  # the drafter's held-out evaluation prompts
        prompts = chat_prompts_ids(target.tokenizer, prompt_set(held_out=True)[:args.prompts])
    else:
        prompts = [list(p.token_ids) for p in bench_prompts(target.tokenizer, args.prompts,
                                                             [args.domain])]
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(temperature=args.temperature, seed=args.seed,
                            max_new_tokens=args.max_tokens,
                            stop_token_ids=(eos,) if eos is not None else ())
    rule = AcceptanceRule(args.rule) if args.temperature else AcceptanceRule.GREEDY
    policy = AcceptancePolicy(rule)
    tallies = [Tally() for _ in args.config]
    for n, prompt in enumerate(prompts, 1):
        outputs = []
        for config, tally in zip(args.config, tallies):  # configs take turns on each prompt
            outputs.append(run_one(target, drafter, prompt, params, config, policy, tally))
        differ = [label(c) for c, out in zip(args.config, outputs) if out != outputs[0]]
        if differ and args.dtype == "float32" and policy.rule is not AcceptanceRule.RECURSIVE:
            raise SystemExit(f"prompt {n}: {', '.join(differ)} emitted other tokens than "
                             f"{label(args.config[0])}")
        why = "sampled" if policy.rule is AcceptanceRule.RECURSIVE else "low-precision rounding"
        print(f"prompt {n}/{len(prompts)} done, {len(outputs[0])} tokens; "
              + (f"differ from the first ({why}): {', '.join(differ)}"
                 if differ else "all configs equal"), flush=True)
    return list(zip(args.config, tallies))


def report(results, args) -> None:
    base = results[0][1]
    table = Table(title=f"{args.domain}, {args.dtype} target, "
                        f"{f'{args.rule} T={args.temperature}' if args.temperature else 'greedy'}")
    for column in ("config", "tokens / pass", "nodes / pass", "tokens/s", "vs first",
                   "draft ms / pass", "verify ms / pass"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for config, t in results:
        s, base_rate = t.stats, base.stats.num_emitted_tokens / base.seconds
        passes = s.num_target_passes
        table.add_row(label(config), f"{s.num_emitted_tokens / passes:.2f}",
                      f"{s.num_draft_tokens / passes:.1f}",
                      f"{s.num_emitted_tokens / t.seconds:.2f}",
                      f"{(s.num_emitted_tokens / t.seconds) / base_rate:.2f}x",
                      f"{1000 * t.draft_s / passes:.1f}", f"{1000 * t.verify_s / passes:.1f}")
    Console(width=150).print(table)
    print(machine())


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--drafter", default=None, help="a model or feature drafter folder")
    parser.add_argument("--dtype", default="float32", help="the target's dtype")
    parser.add_argument("--domain", default="chat", choices=[*domain_names(), "held-out"])
    parser.add_argument("--prompts", type=int, default=6, help="prompts of the domain")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--config", type=parse_config, action="append",
                        help="k, k:nodes:branching or k:nodes:branching:confidence; the "
                        "first is the ratios' base")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--rule", default="keyed", choices=["keyed", "recursive"],
                        help="the sampled rule (trees and chains)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.config = args.config or [parse_config(c) for c in ("0", "4", "4:8:2", "4:16:4")]
    torch.set_num_threads(args.threads)
    target, drafter = default_pair(args.target, args.drafter, "smollm2")
    args.target, args.drafter = args.target or target, args.drafter or drafter
    report(measure(args), args)


if __name__ == "__main__":
    main()
