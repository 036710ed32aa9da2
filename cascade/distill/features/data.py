"""Teacher data for a feature drafter: the target's own answers (greedy and sampled) to the
prompt set, plus real text, with the target's fused-layer hidden states and its top-k
distribution at every position.

Everything stays on the training device: a sequence of T tokens holds T x (layers x hidden)
features in float16 (about 3.5 KB per position for SmolLM2-135M).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import multiprocessing
import os
import random
import sysconfig
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class FeatureSequence:
    tokens: torch.Tensor
    """[T] int64: prompt (chat template applied) and answer, or a window of real text."""
    answer_start: int
    """First position the drafter is scored on (0 for real text)."""
    features: torch.Tensor
    """[T, layers * hidden] the target's hidden states at the fused layers."""
    top_ids: torch.Tensor
    """[T, keep] int64: the target's most likely next tokens at each position."""
    top_probs: torch.Tensor
    """[T, keep] float: their probabilities (temperature 1)."""


@torch.inference_mode()
def annotate(model, rows: list[list[int]], starts: list[int], layers: tuple[int, ...],
             keep: int) -> list[FeatureSequence]:
    """One right-padded forward pass of the target over whole sequences."""
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                output_hidden_states=True)
    stacked = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # [B, W, L*d]
    top_probs, top_ids = out.logits.float().softmax(-1).topk(keep, dim=-1)
    return [FeatureSequence(ids[i, : len(r)].to(device), starts[i],
                            stacked[i, : len(r)].to(torch.float16), top_ids[i, : len(r)],
                            top_probs[i, : len(r)].to(torch.float16))
            for i, r in enumerate(rows)]


@torch.inference_mode()
def answer_prompts(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                   temperature: float, seed: int) -> list[list[int]]:
    """Prompt + answer token ids (cut after the first end-of-sequence), left-padded batch."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    torch.manual_seed(seed)
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
                if temperature > 0 else {"do_sample": False})
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         pad_token_id=pad, **sampling)
    rows = []
    for prompt, generated in zip(prompts, out[:, width:].tolist()):
        eos = tokenizer.eos_token_id
        cut = generated.index(eos) + 1 if eos in generated else len(generated)
        rows.append(prompt + generated[:cut])
    return rows


def greedy_answers(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                   layers: tuple[int, ...], keep: int) -> list[FeatureSequence]:
    """The target's greedy answers to ``prompts``, annotated: what held-out acceptance is
    replayed on."""
    rows = answer_prompts(model, tokenizer, prompts, max_new_tokens, 0.0, 0)
    return annotate(model, rows, [len(p) for p in prompts], layers, keep)


def text_windows(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """Windows of real text available offline: the Python standard library's sources."""
    rng = random.Random(seed)
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    windows = []
    while len(windows) < count and paths:
        ids = tokenizer(rng.choice(paths).read_text(errors="replace")).input_ids
        if len(ids) > length:
            start = rng.randrange(len(ids) - length)
            windows.append(ids[start : start + length])
    return windows


PROSE_PACKAGES = ("transformers", "torch")
"""Installed packages whose docstrings are read as English text (with code in it)."""


@functools.cache
def prose_corpus(packages: tuple[str, ...] = PROSE_PACKAGES,
                 min_chars: int = 400) -> tuple[str, ...]:
    """English text available offline: the Python documentation's topics (pydoc_data) and the
    longer docstrings of the installed ``packages`` (read once per process: about 40 s for
    transformers and torch), in a fixed order."""
    import pydoc_data.topics

    texts = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    paths = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            paths += sorted(Path(spec.submodule_search_locations[0]).rglob("*.py"))
    for found in _map_files(functools.partial(_docstrings, min_chars=min_chars), paths):
        texts += found
    return tuple(texts)


def _map_files(read: Callable[[Path], list[str]], paths: list[Path]) -> Iterable[list[str]]:
    """``read`` over ``paths`` in order, on every core where there are many (a GPU machine's
    16 cores parse transformers and torch in seconds)."""
    workers = min(os.cpu_count() or 1, 16)
    if workers < 4 or len(paths) < 200:
        return map(read, paths)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    with pool:
        return list(pool.map(read, paths, chunksize=32))


def _docstrings(path: Path, min_chars: int) -> list[str]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, kinds))
    return [d for d in docs if d and len(d) >= min_chars]


def prose_windows(tokenizer, count: int, length: int, seed: int,
                  packages: tuple[str, ...] = PROSE_PACKAGES) -> list[list[int]]:
    """Windows of ``prose_corpus`` (whole texts when shorter than ``length``, at least 64)."""
    rng, corpus = random.Random(seed), prose_corpus(packages)
    windows = []
    for _ in range(count * 4):
        if len(windows) == count or not corpus:
            break
        ids = tokenizer(rng.choice(corpus)).input_ids
        if len(ids) >= 64:
            start = rng.randrange(max(1, len(ids) - length))
            windows.append(ids[start : start + length])
    return windows
