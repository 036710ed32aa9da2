"""What a feature distillation writes (``cascade.distill.features.run``): the exported drafter,
its history, and its replay pool's token rows beside it, so a run started from the export trains
on them at once."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from cascade.core.features.feature_runner import write_feature_drafter
from cascade.distill.features.data import FeatureSequence

if TYPE_CHECKING:
    from cascade.distill.features.run import FeatureDistiller


POOL_FILE = "replay_pool.safetensors"
"""The replay pool's token rows beside an export (a few hundred KB): a run started from the
export (``--init``) trains on them at once instead of generating them again."""


def save_pool(pool: list[FeatureSequence], path: Path) -> None:
    flat = torch.cat([s.tokens.cpu() for s in pool]) if pool else torch.zeros(0, dtype=torch.long)
    dtype = torch.uint16 if flat.numel() == 0 or int(flat.max()) < 2 ** 16 else torch.int32
    save_file({"tokens": flat.to(dtype),
               "lengths": torch.tensor([len(s.tokens) for s in pool], dtype=torch.int32),
               "starts": torch.tensor([s.answer_start for s in pool], dtype=torch.int32)},
              str(path))


def newest(pool: list, positions: int) -> list:
    """The newest sequences of ``pool`` holding at most ``positions`` positions in all."""
    kept, total = [], 0
    for sequence in reversed(pool):
        total += len(sequence.tokens)
        if total > positions:
            break
        kept.append(sequence)
    return kept[::-1]


def load_pool(path: Path) -> list[tuple[torch.Tensor, int]]:
    saved = load_file(str(path))
    rows = torch.split(saved["tokens"].to(torch.long), saved["lengths"].tolist())
    return list(zip(rows, saved["starts"].tolist()))


def export(d: FeatureDistiller, out: Path) -> Path:
    write_feature_drafter(d.drafter, d.vocab, out, Path(d.config.target).name)
    save_pool(newest(d.pool, d.config.export_pool_positions), out / POOL_FILE)
    config = {k: str(v) for k, v in asdict(d.config).items() if k not in ("out", "target")}
    record = {"config": config, "history": d.state.history}
    (out / "distill_history.json").write_text(json.dumps(record, indent=1))
    return out
