"""A drafter's restricted vocabulary (FR-Spec): which target tokens its rows stand for."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB_MAP_FILE = "cascade_vocab.json"


class VocabMap:
    """A drafter with a restricted vocabulary (FR-Spec): its rows are a subset of the target's.

    Local row i stands for target token ``token_ids[i]``; one extra last row stands for every
    target token outside the subset when it appears as input. Logits are expanded back to the
    target's vocabulary (-inf outside the subset), so callers never see local ids.
    """

    def __init__(self, token_ids: list[int], target_vocab_size: int) -> None:
        self.target_vocab_size = target_vocab_size
        self.to_target = torch.tensor(token_ids, dtype=torch.long)  # [local]
        self.unknown = len(token_ids)
        self.to_local = torch.full((target_vocab_size,), self.unknown, dtype=torch.long)
        self.to_local[self.to_target] = torch.arange(len(token_ids))

    @classmethod
    def load(cls, folder: Path) -> "VocabMap | None":
        path = folder / VOCAB_MAP_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(data["token_ids"], data["target_vocab_size"])

    def save(self, folder: Path) -> None:
        data = {"target_vocab_size": self.target_vocab_size, "token_ids": self.to_target.tolist()}
        (folder / VOCAB_MAP_FILE).write_text(json.dumps(data))

    def expand(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, local+1] -> [n, target vocab]; the unknown row is dropped."""
        full = logits.new_full((logits.shape[0], self.target_vocab_size), float("-inf"))
        return full.index_copy_(1, self.to_target, logits[:, : self.unknown])
