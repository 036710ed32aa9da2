"""In-process methods: Cascade's core loop and Hugging Face generation, each family in its own
child process (so its peak RSS is its own). Every method runs every prompt ``repeats`` times."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cascade.bench.compare.hf import (HF_DEFAULT, hf_trace, pick_best_hf, restricted_to_full_vocab,
                                      unpacked)
from cascade.bench.measure import Trace, fastest, peak_rss_mb, per_token_ms
from cascade.bench.prompts import BenchPrompt
from cascade.protocol.settings import DraftConfig
from cascade.core.loop import RoundTiming, speculative_rounds
from cascade.core.features.feature_runner import FeatureRunner, load_model
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams


@dataclass(frozen=True)
class Job:
    family: str
    """"core" (Cascade's loop) or "hf" (transformers generate)."""
    target: Path
    drafter: Path
    prompts: tuple[BenchPrompt, ...]
    max_new_tokens: int
    k: int
    """Drafted tokens per round; 0 lets the core family pick the fastest (K_CANDIDATES)."""
    temperature: float
    repeats: int
    threads: int
    seed: int = 0
    hf_drafter: Path | None = None
    """The causal-LM drafter HF assisted generation uses when ``drafter`` is a feature
    drafter (transformers cannot run one)."""


@dataclass
class MethodRun:
    name: str
    family: str
    sampling: bool
    k: int
    runs: list[list[Trace]] = field(default_factory=list)
    """One list of traces per repeat."""
    note: str = ""


@dataclass
class FamilyResult:
    methods: list[MethodRun]
    peak_rss_mb: float | None
    target_ms: float
    drafter_ms: float


def core_trace(target, drafter, prompt: BenchPrompt, params: SamplingParams, k: int) -> Trace:
    trace, timing = Trace(prompt.domain), RoundTiming()
    started, drafted_s, verified_s = time.perf_counter(), 0.0, 0.0
    for block, verdict, _ in speculative_rounds(target, list(prompt.token_ids), params,
                                                drafter if k else None, DraftConfig(k), timing):
        trace.chunk(time.perf_counter() - started, verdict.tokens)
        trace.round(block.num_tokens, verdict.num_accepted, timing.draft_s - drafted_s,
                    timing.verify_s - verified_s, len(verdict.tokens))
        drafted_s, verified_s = timing.draft_s, timing.verify_s
    trace.elapsed_s = time.perf_counter() - started
    return trace


def params_for(job: Job, sampling: bool, eos: int | None) -> SamplingParams:
    return SamplingParams(temperature=job.temperature if sampling else 0.0, seed=job.seed,
                          max_new_tokens=job.max_new_tokens,
                          stop_token_ids=(eos,) if eos is not None else ())


def measure_method(method: MethodRun, job: Job, one: Callable[[BenchPrompt], Trace],
                   tick: Callable[[], None] | None) -> MethodRun:
    """Runs ``one`` on every prompt, ``job.repeats`` times, ticking after each generation."""
    for _ in range(job.repeats):
        run = []
        for prompt in job.prompts:
            run.append(one(prompt))
            if tick is not None:
                tick()
        method.runs.append(run)
    return method


K_CANDIDATES = (1, 2, 3, 4, 6)
"""Draft lengths tried on the first prompts when the benchmark picks k itself (``k = 0``)."""


def pick_best_k(target, drafter, job: Job, tick) -> int:
    """The draft length with the most greedy tokens/s on the first (up to) two prompts."""
    params = params_for(job, False, target.tokenizer.eos_token_id)
    return fastest(K_CANDIDATES, lambda k, prompt: core_trace(target, drafter, prompt, params, k),
                   job.prompts[:2], tick)


def _core_family(job: Job, target: ModelRunner, drafter: ModelRunner, tick) -> list:
    eos = target.tokenizer.eos_token_id
    core_trace(target, drafter, job.prompts[0], params_for(job, False, eos), 2)  # warm up
    k = job.k or pick_best_k(target, drafter, job, tick)
    note = "" if job.k else f"fastest of k in {K_CANDIDATES}"
    methods = [MethodRun("target only (core, k=0)", "core", False, 0),
               MethodRun(f"Cascade core (k={k})", "core", False, k, note=note),
               MethodRun(f"Cascade core (k={k})", "core", True, k, note=note)]
    for m in methods:
        params = params_for(job, m.sampling, eos)
        measure_method(m, job, lambda p, m=m, params=params: core_trace(target, drafter, p, params,
                                                                  m.k), tick)
    return methods


def _hf_family(job: Job, runner: ModelRunner, drafter: ModelRunner, tick) -> list:
    target, assistant = unpacked(runner.model), restricted_to_full_vocab(drafter)
    hf_trace(target, None, job.prompts[0], job, False, HF_DEFAULT)  # warm up
    methods = [(MethodRun("HF generate (no assistant)", "hf", False, 0), None)]
    for sampling in (False, True):
        best = pick_best_hf(target, assistant, job, sampling, tick)
        methods += [(MethodRun("HF assisted, default", "hf", sampling, HF_DEFAULT.k,
                               note=HF_DEFAULT.label), HF_DEFAULT),
                    (MethodRun("HF assisted, best", "hf", sampling, best.k, note=best.label),
                     best)]
    for m, setting in methods:
        model = assistant if setting else None
        measure_method(m, job, lambda p, m=m, model=model, s=setting: hf_trace(
            target, model, p, job, m.sampling, s), tick)
    return [m for m, _ in methods]


def run_family(job: Job, progress=None) -> FamilyResult:
    """Child-process entry: load the pair, run the family's methods, report costs and RSS."""
    torch.set_num_threads(job.threads)
    target = ModelRunner.load(ModelSpec(str(job.target)))
    drafter = load_model(ModelSpec(str(job.drafter)), str(job.target))
    if job.family == "hf" and isinstance(drafter, FeatureRunner):
        # transformers' assistant must be a causal LM: HF runs with the model drafter
        drafter = ModelRunner.load(ModelSpec(str(job.hf_drafter)))
    with torch.inference_mode():
        family = _core_family if job.family == "core" else _hf_family
        tick = (lambda: progress.put(1)) if progress is not None else None
        methods = family(job, target, drafter, tick)
        target_ms, drafter_ms = per_token_ms(target), per_token_ms(drafter)
    return FamilyResult(methods, peak_rss_mb(), target_ms, drafter_ms)
