"""Drive a distillation run: progress with ETA and live acceptance, checkpoints, export."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cascade.distill.precision import resolve_dtype
from cascade.distill.progress import RunProgress
from cascade.distill.train import DistillConfig, Distiller, agreement, estimated_acceptance

CHECKPOINT = "checkpoint.pt"


def save_atomically(payload: dict, folder: Path) -> None:
    """``folder/checkpoint.pt``, replaced in one rename: never a half-written file."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(payload, folder / (CHECKPOINT + ".tmp"))
    (folder / (CHECKPOINT + ".tmp")).replace(folder / CHECKPOINT)


def save_checkpoint(distiller: Distiller, folder: Path) -> None:
    payload = {"model": distiller.model.state_dict() if distiller.model else None,
               "optimizer": distiller.optimizer.state_dict() if distiller.optimizer else None,
               "vocab": distiller.vocab.to_target.tolist() if distiller.vocab else None,
               "state": distiller.state, "buffer": distiller.buffer,
               "random": distiller.random.getstate()}
    save_atomically(payload, folder)


def load_checkpoint(distiller: Distiller, folder: Path) -> bool:
    path = folder / CHECKPOINT
    if not path.exists():
        return False
    payload = torch.load(path, weights_only=False)
    distiller.state, distiller.buffer = payload["state"], payload["buffer"]
    distiller.random.setstate(payload["random"])
    if payload["vocab"] is not None:
        distiller.start_student(vocab=payload["vocab"])
        distiller.model.load_state_dict(payload["model"])
        distiller.optimizer.load_state_dict(payload["optimizer"])
    return True


def _cycle(distiller: Distiller, fraction: float) -> dict:
    chunk = distiller.teacher_chunk()
    record = {"agreement": None, "loss": None}
    if distiller.model is None:
        distiller.buffer.append(chunk)
        if len(distiller.buffer) >= distiller.config.warmup_chunks:
            distiller.start_student()
    else:
        record["agreement"] = agreement(distiller.model, distiller.vocab, chunk)
        distiller.buffer.append(chunk)
        record["loss"] = distiller.train_steps(chunk, fraction)
    return record


def run_distillation(config: DistillConfig) -> Path:
    """Trains until the time budget is spent (resuming from a checkpoint), then exports the
    drafter to ``config.out``; returns that folder."""
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.target)
    teacher = AutoModelForCausalLM.from_pretrained(config.target,
                                                   dtype=resolve_dtype(config.dtype)).eval()
    distiller = Distiller(config, teacher, tokenizer)
    work = config.out / "work"
    if not load_checkpoint(distiller, work) and config.init is not None:
        distiller.start_from(config.init)
    budget, state = config.minutes * 60, distiller.state
    last_save = time.monotonic()
    with RunProgress(budget, state.elapsed_s) as progress:
        while state.elapsed_s < budget:
            started = time.monotonic()
            record = _cycle(distiller, state.elapsed_s / budget)
            state.elapsed_s += time.monotonic() - started
            state.chunks += 1
            answered = sum(len(s.tokens) - s.start for c in distiller.buffer for s in c)
            record.update(elapsed_s=round(state.elapsed_s, 1), answer_tokens=answered)
            if record["agreement"] is not None:
                record["estimated_acceptance"] = estimated_acceptance(record["agreement"])
            state.history.append(record)
            progress.update(state.elapsed_s, _describe(record))
            if time.monotonic() - last_save > config.checkpoint_every_s:
                save_checkpoint(distiller, work)
                last_save = time.monotonic()
    save_checkpoint(distiller, work)
    return export(distiller, config.out)


def _describe(record: dict) -> str:
    if record["agreement"] is None:
        return f"answering (warm-up), {record['answer_tokens']} tokens"
    return (f"{record['answer_tokens']} tokens, agreement {record['agreement']:.2f}, "
            f"est. acceptance@4 {record['estimated_acceptance']:.2f}")


def export(distiller: Distiller, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    distiller.model.to(torch.float16).save_pretrained(out)
    distiller.model.to(torch.float32)
    distiller.tokenizer.save_pretrained(out)
    distiller.vocab.save(out)
    config = {k: str(v) for k, v in asdict(distiller.config).items() if k != "out"}
    config["target"] = Path(config["target"]).name  # a name, not a path of this machine
    history = {"config": config, "history": distiller.state.history}
    (out / "distill_history.json").write_text(json.dumps(history, indent=1))
    return out
