"""Distil a feature drafter for a target (``cascade distill --kind feature``).

Online, like the model drafter's distillation: each cycle the target answers a batch of prompts
(greedy or sampled; every few cycles real text too) and its features and top-k distribution are
kept in a replay pool; the drafter then takes a few training-time-test steps on half fresh, half
replayed sequences. Every ``eval_every_s`` the greedy acceptance at k = 4 is replayed exactly on
held-out answers, the drafter is exported and the run is checkpointed (``out/work``), so a run
resumes where it stopped (with a fresh replay pool).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from cascade.core.features.feature_drafter import FeatureDrafter, FeatureDrafterConfig
from cascade.core.features.feature_runner import load_weights
from cascade.core.model.vocab_map import VocabMap
from cascade.distill.features.data import (FeatureSequence, annotate, answer_prompts,
                                          greedy_answers, PROSE_PACKAGES, prose_corpus,
                                          prose_windows, text_windows)
from cascade.distill.features.pool import POOL_FILE, export, load_pool
from cascade.distill.features.train import build_drafter, greedy_acceptance, make_batch, ttt_loss
from cascade.distill.prompts import code_prompts, doc_prompts, prompt_set
from cascade.distill.precision import resolve_dtype
from cascade.distill.progress import RunProgress
from cascade.distill.run import CHECKPOINT, save_atomically
from cascade.distill.student import choose_vocabulary
from cascade.distill.train import _fill_vocabulary
from cascade.protocol.request.chat import chat_prompts_ids


@dataclass(frozen=True)
class FeatureDistillConfig:
    target: Path
    out: Path
    minutes: float = 60.0
    seed: int = 0
    vocab_size: int = 16384
    num_steps: int = 4
    """Drafting steps unrolled in training (the training-time test)."""
    batch_size: int = 8
    gen_batch: int = 48
    """Prompts the target answers together (48 costs 6.7 ms per position on a 2-core CPU,
    16 costs 11.7 ms: generation is overhead-bound at small batches)."""
    max_new_tokens: int = 160
    keep: int = 32
    lr: float = 1e-3
    steps_per_chunk: int = 40
    """Optimiser steps per teacher batch: the target's generation costs about as much as 40
    steps (2-core CPU), so fewer steps leave the run mostly generating."""
    eval_sequences: int = 12
    eval_every_s: float = 600.0
    max_pool_positions: int = 1_500_000
    export_pool_positions: int = 250_000
    """The newest this many pool positions ship with an export: a run started from it
    re-annotates them (about 4 ms each on a 2-core CPU: 250k is a quarter of an hour)."""
    text_every: int = 4
    """Every this many cycles, real-text windows join the pool (teacher forcing)."""
    prose_per_batch: int = 32
    """Windows of English text (Python documentation, docstrings) teacher-forced with each
    batch of answers: answers to the ~700 chat prompts repeat (greedy ones exactly), text is
    varied and costs a forward pass per window instead of a generation."""
    prose_packages: tuple[str, ...] = PROSE_PACKAGES
    """Installed packages whose docstrings join the text (the Python documentation always)."""
    dtype: str = "auto"
    """Teacher and training precision: auto (bfloat16 only on CPUs with bf16 instructions),
    float32 or bfloat16 (cascade.distill.precision)."""
    init: Path | None = None
    """Start from an exported feature drafter (its weights and vocabulary, fresh optimiser)."""
    device: str = "cpu"
    """Where the teacher and the drafter run (``cuda``: the batch sizes above can then grow a
    hundredfold; the drafter's model card gives a GPU run's settings)."""
    annotate_rows: int = 16
    """Sequences per annotating forward pass (bounds the memory its logits take)."""


@dataclass
class RunState:
    elapsed_s: float = 0.0
    chunks: int = 0
    steps: int = 0
    annotated: int = 0
    """Positions the target annotated (answers and text), over every run."""
    history: list[dict] = field(default_factory=list)


class FeatureDistiller:
    def __init__(self, config: FeatureDistillConfig, teacher, tokenizer) -> None:
        self.config, self.teacher, self.tokenizer = config, teacher, tokenizer
        self.layers = FeatureDrafterConfig.for_target(teacher.config).feature_layers
        # Up to half of every batch from the templated chat prompts, the rest from the ~5,500
        # prompts about standard-library code and those about documentation paragraphs:
        # drawn from the pooled list, the ~700 chat prompts would be a few per cent.
        self.prompt_groups = (
            self._fitting(prompt_set(held_out=False, seed=config.seed)),
            self._fitting(code_prompts(seed=config.seed)),
            self._fitting(doc_prompts(prose_corpus(config.prose_packages), seed=config.seed)))
        self.random = random.Random(config.seed)
        self.pool: list[FeatureSequence] = []
        self.state = RunState()
        self.drafter: FeatureDrafter | None = None
        self.vocab: VocabMap | None = None
        self.optimizer = None
        self.held_out = self._held_out()

    def _fitting(self, texts: list[str]) -> list[list[int]]:
        """Encoded prompts that leave room for an answer in the target's context."""
        config = self.teacher.config
        context = getattr(config, "max_position_embeddings", None) or config.n_positions
        return [p for p in chat_prompts_ids(self.tokenizer, texts)
                if len(p) + self.config.max_new_tokens <= context]

    def _held_out(self) -> list[FeatureSequence]:
        c = self.config
        prompts = self._fitting(prompt_set(held_out=True))[: c.eval_sequences]
        return greedy_answers(self.teacher, self.tokenizer, prompts, c.max_new_tokens,
                              self.layers, c.keep)

    def batch_prompts(self) -> list[list[int]]:
        """``gen_batch`` prompts: up to half chat, the rest code and documentation alike."""
        chat, code, docs = self.prompt_groups
        size = self.config.gen_batch
        prompts = self.random.sample(chat, min(size // 2, len(chat)))
        rest = [g for g in (code, docs) if g]
        for i, group in enumerate(rest):
            share = (size - len(prompts)) // (len(rest) - i)
            prompts += self.random.sample(group, min(share, len(group)))
        return prompts

    def teacher_chunk(self) -> list[FeatureSequence]:
        c, n = self.config, self.state.chunks
        prompts = self.batch_prompts()
        temperature = (0.0, 0.7, 0.0, 1.0)[n % 4]  # half greedy, as the default pair serves
        rows = answer_prompts(self.teacher, self.tokenizer, prompts, c.max_new_tokens,
                              temperature, c.seed + n)
        chunk = self._annotated(rows, [len(p) for p in prompts])
        if n % c.text_every == c.text_every - 1:
            windows = text_windows(self.tokenizer, max(1, c.gen_batch // 4), 192, c.seed + n)
            chunk += self._annotated(windows, [0] * len(windows))
        if c.prose_per_batch:  # cheap variety: one forward pass, no generation
            windows = prose_windows(self.tokenizer, c.prose_per_batch, 192, c.seed + n,
                                    c.prose_packages)
            chunk += self._annotated(windows, [0] * len(windows))
        return chunk

    def start_drafter(self, vocab: list[int] | None = None) -> None:
        """Build the drafter; its vocabulary comes from the pool's answers unless given."""
        c = self.config
        if vocab is None:
            counts = Counter(t for s in self.pool for t in s.tokens[s.answer_start:].tolist())
            vocab = choose_vocabulary(counts, list(self.tokenizer.all_special_ids), c.vocab_size)
            vocab = _fill_vocabulary(vocab, self.tokenizer, c.vocab_size)
        self.drafter, self.vocab = build_drafter(self.teacher, vocab, c.seed)
        self.to_local = self.vocab.to_local.to(self.teacher.device)
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=c.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def start_from(self, folder: Path) -> None:
        """Weights and vocabulary of an export, and its replay pool when it has one."""
        self.start_drafter(VocabMap.load(folder).to_target.tolist())
        load_weights(self.drafter, folder)
        if (folder / POOL_FILE).exists():
            self.restore_pool(load_pool(folder / POOL_FILE))

    def restore_pool(self, saved: list[tuple[torch.Tensor, int]]) -> None:
        """Rebuild a checkpoint's replay pool: its token rows, re-annotated by the target
        (the features are not stored: a forward pass costs far less than the disk)."""
        self.pool += self._annotated([t.tolist() for t, _ in saved],
                                     [start for _, start in saved])

    def _annotated(self, rows: list[list[int]], starts: list[int]) -> list[FeatureSequence]:
        """``annotate`` over many rows, ``annotate_rows`` per forward pass (bounded memory)."""
        group = self.config.annotate_rows
        self.state.annotated += sum(len(r) for r in rows)
        return [sequence for i in range(0, len(rows), group)
                for sequence in annotate(self.teacher, rows[i : i + group],
                                         starts[i : i + group], self.layers, self.config.keep)]

    def add(self, chunk: list[FeatureSequence]) -> None:
        self.pool += chunk
        while sum(len(s.tokens) for s in self.pool) > self.config.max_pool_positions:
            self.pool.pop(0)

    def train_steps(self, fresh: list[FeatureSequence], fraction: float) -> tuple[float, list]:
        c, half = self.config, self.config.batch_size // 2
        loss, agreement = torch.tensor(0.0), []
        for _ in range(c.steps_per_chunk):
            batch = self.random.sample(fresh, min(half, len(fresh)))
            batch += self.random.sample(self.pool, min(c.batch_size - len(batch), len(self.pool)))
            warm = min(1.0, (self.state.steps + 1) / 50)
            for group in self.optimizer.param_groups:
                group["lr"] = c.lr * warm * (1.0 if fraction < 0.8 else max(0.1, (1 - fraction) / 0.2))
            bf16 = self.teacher.dtype == torch.bfloat16
            with torch.autocast(self.teacher.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss, agreement = ttt_loss(self.drafter, make_batch(batch, self.to_local),
                                           c.num_steps)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], 1.0)
            self.optimizer.step()
            self.state.steps += 1
        return float(loss.detach()), agreement

    def evaluate(self) -> tuple[float, float]:
        self.drafter.eval()
        result = greedy_acceptance(self.drafter, self.held_out, self.to_local, k=4)
        self.drafter.train()
        return result


def save_checkpoint(d: FeatureDistiller, folder: Path) -> None:
    pool = [(s.tokens.to(torch.int32).cpu(), s.answer_start) for s in d.pool]
    save_atomically({"drafter": d.drafter.state_dict(), "optimizer": d.optimizer.state_dict(),
                     "vocab": d.vocab.to_target.tolist(), "state": asdict(d.state),
                     "random": d.random.getstate(), "pool": pool}, folder)


def load_checkpoint(d: FeatureDistiller, folder: Path) -> bool:
    path = folder / CHECKPOINT
    if not path.exists():
        return False
    payload = torch.load(path, weights_only=False, map_location=d.teacher.device)
    d.start_drafter(payload["vocab"])
    d.drafter.load_state_dict(payload["drafter"])
    d.optimizer.load_state_dict(payload["optimizer"])
    d.state = RunState(**payload["state"])
    d.random.setstate(payload["random"])
    d.restore_pool(payload.get("pool", []))
    return True


def _cycle(d: FeatureDistiller, fraction: float) -> dict:
    chunk = d.teacher_chunk()
    d.add(chunk)
    if d.drafter is None:
        d.start_drafter()
    loss, agreement = d.train_steps(chunk, fraction)
    positions = sum(len(s.tokens) for s in d.pool)
    return {"loss": round(loss, 4), "agreement": [round(a, 3) for a in agreement],
            "pool_positions": positions}


def run_feature_distillation(config: FeatureDistillConfig) -> Path:
    """Trains until the time budget is spent (resuming from ``out/work``), then exports."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.target)
    teacher = AutoModelForCausalLM.from_pretrained(
        config.target, dtype=resolve_dtype(config.dtype)).to(config.device).eval()
    d = FeatureDistiller(config, teacher, tokenizer)
    work = config.out / "work"
    if not load_checkpoint(d, work) and config.init is not None:
        d.start_from(config.init)
    budget, last_eval = config.minutes * 60, time.monotonic()
    with RunProgress(budget, d.state.elapsed_s) as progress:
        while d.state.elapsed_s < budget:
            started = time.monotonic()
            record = _cycle(d, d.state.elapsed_s / budget)
            d.state.elapsed_s += time.monotonic() - started
            d.state.chunks += 1
            record.update(elapsed_s=round(d.state.elapsed_s, 1), steps=d.state.steps)
            d.state.history.append(record)
            if d.state.elapsed_s >= budget or time.monotonic() - last_eval > config.eval_every_s:
                _checkpoint(d, work, config.out, record)
                last_eval = time.monotonic()
            progress.update(d.state.elapsed_s, _describe(d))
    return config.out


def _checkpoint(d: FeatureDistiller, work: Path, out: Path, record: dict) -> None:
    """Measure on the held-out answers (into ``record``), checkpoint, export."""
    acceptance, length = d.evaluate()
    record.update(held_out_acceptance_k4=round(acceptance, 4),
                  mean_accepted_length=round(length, 3))
    save_checkpoint(d, work)
    export(d, out)


def _describe(d: FeatureDistiller) -> str:
    last = d.state.history[-1]
    held = [h for h in d.state.history if "held_out_acceptance_k4" in h]
    measured = f", held-out acc@4 {held[-1]['held_out_acceptance_k4']:.3f}" if held else ""
    return (f"{d.state.annotated} annotated, {last['pool_positions']} in the pool, "
            f"{d.state.steps} steps, agreement by step "
            f"{'/'.join(f'{a:.2f}' for a in last['agreement'])}{measured}")
