"""Quality versus cost of speculative cascades (``cascade bench cascades``).

On held-out prompts (prose, chat, code; greedy decoding) every deferral rule runs over a sweep of
alpha, beside lossless speculative decoding and a classic cascade (the drafter's token unless its
confidence is below a threshold; then the target decodes that one token; no speculation).

Cost: target forward passes per generated token (rounds for speculative methods, deferrals for
the classic cascade) and wall-clock tokens/s in one process. Quality, scored by the target at
temperature 1 on each output with its own prefix: the mean log-likelihood per token, and the
fraction of tokens equal to the target's greedy choice at that position (1.0 for any lossless
greedy run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from cascade.bench.prompts import BenchPrompt
from cascade.core.loop import speculative_rounds
from cascade.core.model.runner import ModelRunner
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule

RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")
ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
CLASSIC_THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99)
"""The classic cascade keeps the drafter's token when its top probability is at least this."""


@dataclass(frozen=True)
class Method:
    name: str
    """lossless, classic, or a cascade rule."""
    knob: float
    """alpha for the cascade rules, the confidence threshold for classic, 0 for lossless."""


@dataclass
class Score:
    """Totals over the prompts of one method."""

    method: Method
    tokens: int = 0
    target_passes: int = 0
    seconds: float = 0.0
    log_likelihood: float = 0.0
    target_argmax: int = 0
    """Generated tokens equal to the target's greedy choice given the same prefix."""
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, output: list[int], passes: int, seconds: float, quality: tuple[float, int]
            ) -> None:
        self.tokens += len(output)
        self.target_passes += passes
        self.seconds += seconds
        self.log_likelihood += quality[0]
        self.target_argmax += quality[1]
        self.outputs.append(output)

    def row(self) -> dict:
        n = max(1, self.tokens)
        return {"method": self.method.name, "knob": self.method.knob, "tokens": self.tokens,
                "passes_per_token": round(self.target_passes / n, 4),
                "tokens_per_s": round(self.tokens / max(self.seconds, 1e-9), 2),
                "mean_log_likelihood": round(self.log_likelihood / n, 4),
                "target_argmax_fraction": round(self.target_argmax / n, 4)}


def methods(rules=RULES, alphas=ALPHAS, thresholds=CLASSIC_THRESHOLDS) -> list[Method]:
    return ([Method("lossless", 0.0)] + [Method(r, a) for r in rules for a in alphas]
            + [Method("classic", t) for t in thresholds])


def speculative(target: ModelRunner, drafter: ModelRunner, prompt: list[int],
                params: SamplingParams, k: int, policy: AcceptancePolicy) -> tuple[list[int], int]:
    """(generated tokens, target passes) of one speculative run; one pass per round."""
    rounds = 0
    verifier = None
    for _, _, verifier in speculative_rounds(target, prompt, params, drafter,
                                             DraftConfig(num_draft_tokens=k), policy=policy):
        rounds += 1
    return list(verifier.generated), rounds


@torch.inference_mode()
def classic_cascade(target: ModelRunner, drafter: ModelRunner, prompt: list[int],
                    params: SamplingParams, threshold: float) -> tuple[list[int], int]:
    """The drafter decodes greedily; where its top probability (temperature 1) is below
    ``threshold`` the target decodes that token instead, catching up on the drafter's tokens in
    the same pass. Returns (generated tokens, target passes)."""
    draft_cache, target_cache = drafter.new_cache(), target.new_cache()
    tokens = list(prompt)
    logits = draft_cache.forward_to(tokens).logits[-1]
    generated, passes = [], 0
    while len(generated) < params.max_new_tokens:
        probs = torch.softmax(logits, dim=-1)
        token = int(probs.argmax())
        if float(probs.max()) < threshold:
            token = int(target_cache.forward_to(tokens).logits[-1].argmax())
            passes += 1
        tokens.append(token)
        generated.append(token)
        if token in params.stop_token_ids:
            break
        logits = draft_cache.extend([token], num_logits=1).logits[-1]
    return generated, passes


@torch.inference_mode()
def quality(target: ModelRunner, prompt: list[int], output: list[int]) -> tuple[float, int]:
    """(sum of log p(token | prefix) at temperature 1, tokens equal to the target's argmax)."""
    if not output:
        return 0.0, 0
    logits = target.new_cache().extend(prompt + output, num_logits=len(output) + 1).logits[:-1]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = torch.tensor(output)
    log_likelihood = float(log_probs.gather(1, chosen.unsqueeze(1)).sum())
    return log_likelihood, int((logits.argmax(dim=-1) == chosen).sum())


def run_method(method: Method, target: ModelRunner, drafter: ModelRunner,
               prompts: list[BenchPrompt], params: SamplingParams, k: int) -> Score:
    score = Score(method)
    for prompt in prompts:
        ids = list(prompt.token_ids)
        started = time.perf_counter()
        if method.name == "classic":
            output, passes = classic_cascade(target, drafter, ids, params, method.knob)
        else:
            rule = AcceptanceRule.GREEDY if method.name == "lossless" else method.name
            policy = AcceptancePolicy(rule, method.knob)
            output, passes = speculative(target, drafter, ids, params, k, policy)
        seconds = time.perf_counter() - started
        score.add(output, passes, seconds, quality(target, ids, output))
    return score


def evaluate(target: ModelRunner, drafter: ModelRunner, prompts: list[BenchPrompt],
             params: SamplingParams, k: int, chosen: list[Method],
             progress: Callable[[Score], None] = lambda score: None) -> Iterator[Score]:
    run_method(Method("lossless", 0.0), target, drafter, prompts[:1], params, k)  # warm-up
    for method in chosen:
        score = run_method(method, target, drafter, prompts, params, k)
        progress(score)
        yield score


def add_services(rows: list[dict], scores: list[Score], runs: dict) -> None:
    """Each row's tokens/s on the services and whether they emitted the in-process tokens."""
    for row, score in zip(rows, scores, strict=True):
        run = runs.get(score.method)
        if run is not None:
            row["services_tokens_per_s"] = run.tokens_per_s
            row["services_same_tokens"] = run.outputs == score.outputs


def rows_markdown(rows: list[dict]) -> str:
    header = ("| method | knob | passes/token | tokens/s (1 process) | tokens/s (services) | "
              "same tokens | mean log-lik | = target argmax |\n|---|---|---|---|---|---|---|---|\n")
    return header + "".join(
        f"| {r['method']} | {r['knob']} | {r['passes_per_token']:.3f} | {r['tokens_per_s']} | "
        f"{r.get('services_tokens_per_s', '–')} | {_yes_no(r.get('services_same_tokens'))} | "
        f"{r['mean_log_likelihood']:.3f} | {r['target_argmax_fraction']:.3f} |\n" for r in rows)


def _yes_no(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def plot(rows: list[dict], path, title: str):
    """Quality (mean log-likelihood) against cost (passes per token, and tokens/s), one curve
    per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    names = list(dict.fromkeys(r["method"] for r in rows))
    for name in names:
        style = {"marker": "*", "markersize": 14} if name == "lossless" else {"marker": "o"}
        for ax, cost in zip(axes, ("passes_per_token", "tokens_per_s"), strict=True):
            points = sorted((r for r in rows if r["method"] == name), key=lambda r: r[cost])
            ax.plot([p[cost] for p in points], [p["mean_log_likelihood"] for p in points],
                    label=name, **style)
    axes[0].set_xlabel("target passes per generated token (lower is cheaper)")
    axes[1].set_xlabel("tokens/s in one process (higher is faster)")
    for ax in axes:
        ax.set_ylabel("mean log-likelihood per token under the target")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
