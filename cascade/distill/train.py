"""Online self-distillation: the target answers prompts, the drafter learns its distributions.

Each cycle: the target (bfloat16 where the CPU has bf16 instructions, else float32) answers a batch of training prompts (greedy or sampled); the
drafter's top-1 agreement with the teacher on that fresh batch is measured (the live acceptance
estimate); then a few AdamW steps train on half new, half replayed sequences. Loss: cross-entropy
to the teacher's top-k distribution restricted to the drafter's vocabulary, plus extra weight on
the teacher's top token. Learning rate: warm-up, constant, linear decay over the last 15% of the
time budget. Checkpoints make the run resumable.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cascade.distill.prompts import training_prompts
from cascade.distill.student import StudentShape, build_student, choose_vocabulary
from cascade.distill.teacher import Sequence, answer
from cascade.protocol.request.chat import chat_prompts_ids
from cascade.core.model.vocab_map import VOCAB_MAP_FILE, VocabMap


@dataclass(frozen=True)
class DistillConfig:
    target: Path
    out: Path
    minutes: float = 60.0
    """Wall-clock budget for teacher data and training (resumed runs count what was spent)."""
    seed: int = 0
    batch_prompts: int = 32
    max_new_tokens: int = 128
    keep: int = 32
    """Teacher log-probabilities kept per position."""
    temperatures: tuple[float, ...] = (0.0, 0.0, 0.7, 1.0)
    """Answer temperatures, drawn per chunk (greedy twice as often)."""
    steps_per_chunk: int = 16
    batch_size: int = 16
    lr: float = 2e-3
    top_token_weight: float = 0.5
    warmup_chunks: int = 4
    """Chunks answered before the vocabulary is chosen from the answers' token counts."""
    checkpoint_every_s: float = 300.0
    dtype: str = "auto"
    """Teacher and training precision: auto (bfloat16 only on CPUs with bf16 instructions),
    float32 or bfloat16 (cascade.distill.precision)."""
    shape: StudentShape = field(default_factory=StudentShape)
    init: Path | None = None
    """A drafter folder (from an earlier run's export) to start from instead of a fresh
    student; its own shape and vocabulary are kept, the optimiser starts fresh."""


def agreement(model, vocab: VocabMap, sequences: list[Sequence]) -> float:
    """Fraction of answer positions where the drafter's argmax is the teacher's."""
    with torch.inference_mode():
        inputs, rows, cols, teacher = _batch(vocab, sequences)
        predicted = vocab.to_target[model(**inputs).logits[rows, cols, : vocab.unknown].argmax(-1)]
    return float((predicted == teacher[0][:, 0]).float().mean())


def _batch(vocab: VocabMap, sequences: list[Sequence]):
    """Right-padded local ids, the (row, col) of each answer position, and teacher targets."""
    width = max(len(s.tokens) for s in sequences) - 1
    ids = torch.full((len(sequences), width), vocab.unknown, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    rows, cols = [], []
    for row, seq in enumerate(sequences):
        local = vocab.to_local[torch.tensor(seq.tokens[:-1])]
        ids[row, : len(local)], mask[row, : len(local)] = local, 1
        span = range(seq.start - 1, len(seq.tokens) - 1)
        rows += [row] * len(span)
        cols += list(span)
    top_ids = torch.cat([s.top_ids for s in sequences]).long()
    top_logp = torch.cat([s.top_logp for s in sequences]).float()
    return ({"input_ids": ids, "attention_mask": mask}, torch.tensor(rows), torch.tensor(cols),
            (top_ids, top_logp))


def distill_loss(model, vocab: VocabMap, sequences: list[Sequence], top_weight: float,
                 bf16: bool = False):
    inputs, rows, cols, (top_ids, top_logp) = _batch(vocab, sequences)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(**inputs).logits[rows, cols].float()  # [positions, local vocab]
    logp = torch.log_softmax(logits, -1)
    local = vocab.to_local[top_ids]  # [positions, keep]
    known = local != vocab.unknown
    probs = top_logp.exp() * known
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
    soft = -(probs * logp.gather(-1, local)).sum(-1)
    hard = -logp.gather(-1, local[:, :1]).squeeze(-1) * known[:, 0]
    return (soft + top_weight * hard).mean()


@dataclass
class RunState:
    elapsed_s: float = 0.0
    chunks: int = 0
    steps: int = 0
    history: list[dict] = field(default_factory=list)
    """One entry per chunk: elapsed_s, answer tokens so far, agreement, estimated acceptance."""


def estimated_acceptance(p: float, k: int = 4) -> float:
    """Acceptance at draft length k if each position agreed independently with probability p."""
    return sum(p**i for i in range(1, k + 1)) / k


class Distiller:
    def __init__(self, config: DistillConfig, teacher, tokenizer) -> None:
        self.config, self.teacher, self.tokenizer = config, teacher, tokenizer
        context = getattr(teacher.config, "max_position_embeddings", None) or \
            teacher.config.n_positions
        self.prompts = [p for p in chat_prompts_ids(tokenizer, training_prompts(config.seed))
                        if len(p) + config.max_new_tokens <= context]
        self.random = random.Random(config.seed)
        self.buffer: list[list[Sequence]] = []
        self.state = RunState()
        self.model = self.vocab = self.optimizer = None

    def teacher_chunk(self) -> list[Sequence]:
        c = self.config
        batch = self.random.sample(self.prompts, c.batch_prompts)
        temperature = self.random.choice(c.temperatures)
        return answer(self.teacher, self.tokenizer, batch, c.max_new_tokens, temperature,
                      c.keep, seed=c.seed + self.state.chunks)

    def start_student(self, vocab: list[int] | None = None) -> None:
        """Build the drafter; its vocabulary comes from the answers so far unless given."""
        if vocab is None:
            counts = Counter(t for chunk in self.buffer for s in chunk for t in s.tokens)
            special = list(self.tokenizer.all_special_ids)
            vocab = choose_vocabulary(counts, special, self.config.shape.vocab_size)
            vocab = _fill_vocabulary(vocab, self.tokenizer, self.config.shape.vocab_size)
        self.model, self.vocab = build_student(self.config.shape, vocab, self.teacher,
                                               self.config.seed)
        self._new_optimizer()

    def start_from(self, folder: Path) -> None:
        """Continue from an exported drafter: its weights and vocabulary, a fresh optimiser."""
        from transformers import AutoModelForCausalLM

        vocab = VocabMap.load(folder)
        if vocab is None:
            raise ValueError(f"{folder} has no {VOCAB_MAP_FILE}: not a drafter made by "
                             "`cascade distill`")
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.vocab = vocab
        self._new_optimizer()

    def _new_optimizer(self) -> None:
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr,
                                           betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(self, fraction: float) -> float:
        warm = min(1.0, (self.state.steps + 1) / 20)
        decay = 1.0 if fraction < 0.85 else max(0.1, (1.0 - fraction) / 0.15)
        return self.config.lr * warm * decay

    def train_steps(self, fresh: list[Sequence], fraction: float) -> float:
        self.model.train()
        pool = [s for chunk in self.buffer for s in chunk]
        half = self.config.batch_size // 2
        loss = torch.tensor(0.0)
        for _ in range(self.config.steps_per_chunk):
            batch = self.random.sample(fresh, min(half, len(fresh)))
            batch += self.random.sample(pool, min(half, len(pool)))
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(fraction)
            loss = distill_loss(self.model, self.vocab, batch, self.config.top_token_weight,
                                self.teacher.dtype == torch.bfloat16)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.state.steps += 1
        self.model.eval()
        return float(loss.detach())


def _fill_vocabulary(vocab: list[int], tokenizer, size: int) -> list[int]:
    """Top up a vocabulary chosen from little data with the tokenizer's lowest ids (BPE merges
    come roughly in frequency order, so low ids are the common ones)."""
    chosen = set(vocab)
    for token in range(len(tokenizer)):
        if len(chosen) >= size:
            break
        chosen.add(token)
    return sorted(chosen)

