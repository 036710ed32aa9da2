"""Profiling the verifier's step cost: real ``VerifyEngine.run`` passes of a grid of shapes,
timed within a budget and fitted (``step_cost.StepCostModel``); ``load_or_profile`` caches a
profile per model, dtype, kind of pass, torch version and machine."""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from dataclasses import dataclass, replace
from itertools import zip_longest
from pathlib import Path

import torch

from cascade.core.forward import packed_weights
from cascade.core.forward.graph_ops import is_compiled
from cascade.core.forward.row_rules import padded
from cascade.core.kv.kv_store import BLOCK_SIZE
from cascade.core.paths import cache_root
from cascade.core.verify.engine import Pass, VerifyEngine
from cascade.core.verify.step_cost import Point, StepCostError, StepCostModel, StepShape

PASS_REVISION = 2
"""Bumped when the pass's code changes what a shape costs (2: packed weight products, one
attention call per layer), so profiles cached before are measured again."""
_MATMUL_FLAGS = {"amx_bf16", "amx_fp16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_fp16",
                 "avx512_vnni", "avx512f", "avx_vnni", "avx2", "fma", "asimd", "sve", "bf16"}


@dataclass(frozen=True)
class ProfileGrid:
    """The passes ``profile`` times: every (rows, new tokens per row, cached per row), plus
    one-row passes of every token count up to ``dense_tokens``: small passes are where kernel
    blocking shows most (on some CPUs an odd count is slower than the even one above it)."""

    rows: tuple[int, ...] = (1, 2, 4, 8, 16)
    tokens: tuple[int, ...] = (1, 2, 3, 5, 9, 17)
    cached: tuple[int, ...] = (16, 512)
    dense_tokens: int = 16

    def __post_init__(self) -> None:
        for name, low in (("rows", 1), ("tokens", 1), ("cached", 0)):
            if not getattr(self, name) or min(getattr(self, name)) < low:
                raise ValueError(f"{name} must hold ints >= {low}, got {getattr(self, name)}")

    def within(self, max_length: int) -> ProfileGrid:
        """The grid cut to a model's positions (learned position embeddings end there)."""
        tokens = tuple(t for t in self.tokens if t <= max_length) or (1,)
        cached = tuple(sorted({min(c, max_length - max(tokens)) for c in self.cached}))
        return replace(self, tokens=tokens, cached=cached,
                       dense_tokens=min(self.dense_tokens, max_length - min(cached)))

    def shapes(self) -> list[tuple[int, int, int]]:
        """(rows, tokens per row, cached per row), in the order worth measuring: the cheapest
        pass of each doubling of the token count, then the next cheapest of each, and so on;
        a budget that cuts the list short still spans every pass size."""
        grid = {(r, t, c) for r in self.rows for t in self.tokens for c in self.cached}
        grid |= {(1, t, min(self.cached)) for t in range(1, self.dense_tokens + 1)}
        sizes: dict[int, list] = {}
        for shape in sorted(grid, key=lambda g: (g[0] * g[1], g[2], g[0])):
            sizes.setdefault((shape[0] * shape[1]).bit_length(), []).append(shape)
        return [g for rank in zip_longest(*sizes.values()) for g in rank if g]


def _time(engine: VerifyEngine, passes: list[Pass]) -> float:
    """Seconds of one real engine pass; every row feeds exactly its new tokens again."""
    for p in passes:
        p.cache.tokens = p.tokens[: len(p.tokens) - p.num_logits]
    start = time.perf_counter()
    engine.run(passes)  # returns after the logits reached the host (a device sync)
    return time.perf_counter() - start


def _measure(engine: VerifyEngine, plan: list, seconds: float, repeats: int) -> list[Point]:
    """(shape, median seconds) for as much of ``plan`` as the budget allows: one warm-up call
    per shape (also its cost estimate) within a third of the budget, then, in plan order, the
    shapes whose three rounds still fit (one that does not is skipped, a cheaper one after it
    may fit), rounds interleaved so a burst of other load spreads thin."""
    start = time.perf_counter()
    for _ in range(2):
        _time(engine, plan[0][1])
    warm = []
    for _, passes in plan:
        if warm and time.perf_counter() - start > seconds / 3:
            break
        warm.append(_time(engine, passes))
    remaining = seconds - (time.perf_counter() - start)
    chosen, round_s = [], 0.0
    for item, estimate in zip(plan, warm):
        if not chosen or 3 * (round_s + estimate) <= remaining:
            chosen.append(item)
            round_s += estimate
    samples: list[list[float]] = [[] for _ in chosen]
    for _ in range(max(3, min(repeats, int(remaining / round_s)))):
        for times, (_, passes) in zip(samples, chosen):
            times.append(_time(engine, passes))
        if time.perf_counter() - start > seconds:  # other load slowed every pass
            break
    return [(shape, statistics.median(times)) for times, (shape, _) in zip(samples, chosen)]


def profile(runner, seconds: float = 20.0, grid: ProfileGrid | None = None,
            repeats: int = 5, invariant: bool = True) -> StepCostModel:
    """Calibrate on the real packed pass: time ``grid``'s passes within about ``seconds``
    (median of up to ``repeats``) and fit. Cached contents are random values, not a prefill:
    a pass's time does not depend on them, and prefilling every row would eat the budget."""
    shapes = (grid or ProfileGrid()).within(runner.max_length).shapes()
    positions, num_rows = max(c + t for _, t, c in shapes), max(r for r, _, _ in shapes)
    room = (padded(positions, BLOCK_SIZE) + BLOCK_SIZE) * num_rows  # and admission's growth
    engine = VerifyEngine(runner, kv_tokens=room, invariant=invariant)
    engine.store.randomize()
    caches = [engine.admit(positions) for _ in range(num_rows)]
    ids = [i % runner.vocab_size for i in range(positions)]
    plan = [(StepShape(r, r * t, r * c), [Pass(caches[i], ids[: c + t], t) for i in range(r)])
            for r, t, c in shapes]
    try:
        points = _measure(engine, plan, seconds, repeats)
        retimed = _retime(engine, dict(plan), points, StepCostModel.fit(points))
    finally:
        for cache in caches:
            cache.release()
    model = StepCostModel.fit(points, meta=identity(runner))
    model.retimed = retimed
    return model


def _retime(engine: VerifyEngine, passes: dict, points: list[Point],
            model: StepCostModel) -> list[Point]:
    """Time again (median of three) the points the fit disagrees with, in place: a burst of
    other load does not repeat, a real effect does. Returns the first timings replaced."""
    first = []
    for i in model.disagreeing():
        shape = points[i][0]
        first.append(points[i])
        points[i] = (shape, statistics.median(_time(engine, passes[shape]) for _ in range(3)))
    return first


def _cpu() -> tuple[str, list[str]]:
    """The processor's name and the flags its matmul kernels depend on."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    name = fields.get("model name") or platform.processor() or platform.machine()
    return name, sorted(flags & _MATMUL_FLAGS)


def identity(runner, invariant: bool = True) -> dict:
    """What a pass's time depends on besides its shape: the model, its dtype, the kind of pass
    (batch-invariant or plain), torch, the machine (processor and its matrix extensions, or
    the GPU), the threads torch uses and the tensor-parallel ranks."""
    model, (cpu, flags) = runner.model, _cpu()
    config = {k: v for k, v in model.config.to_dict().items() if k != "_name_or_path"}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    found = {"model": Path(model.name_or_path or "unnamed").name or "unnamed",
             "config": digest.hexdigest()[:16],
             "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
             "torch": torch.__version__, "cpu": cpu, "cpu_flags": flags,
             "threads": torch.get_num_threads(), "device": str(runner.device),
             "pass": "invariant" if invariant else "plain", "revision": PASS_REVISION,
             "weights": "packed" if packed_weights.is_packed(model) else "dense",
             "compiled": is_compiled(model)}
    if runner.device.type == "cuda":
        found["gpu"] = torch.cuda.get_device_name(runner.device)
    shard = getattr(model, "cascade_shard", None)
    if shard is not None:  # a tensor-parallel slice: its passes wait for the other ranks
        found["ranks"] = shard.world
    return found


def cache_path(runner, cache_dir: Path, invariant: bool = True) -> Path:
    """The profile's file: the model's folder name and a digest of its whole identity."""
    found = identity(runner, invariant)
    key = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{found['model']}-{key}.json"


def user_cache_dir() -> Path:
    """Where profiles are cached: ``step-cost`` under the user's cache root."""
    return cache_root() / "step-cost"


def load_or_profile(runner, cache_dir: Path | None = None, **profile_args) -> StepCostModel:
    """The cached profile of this model on this machine (under ``cache_dir``, default
    ``user_cache_dir()``), else a new one (saved)."""
    path = cache_path(runner, cache_dir or user_cache_dir(), profile_args.get("invariant", True))
    try:
        return StepCostModel.from_json(path.read_text())
    except (FileNotFoundError, StepCostError):  # none yet, or damaged: measured again
        pass
    model = profile(runner, **profile_args)
    model.save(path)
    return model
