"""The built-in model pairs: SmolLM2-135M-Instruct with its distilled drafter (the default), or
the tiny random-weight pair; or any two folders that share a tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, DirectoryPath, Field

from cascade.core.paths import cache_root

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MODEL_DRAFTER = ASSETS / "smollm2-135m-drafter"
"""The distilled small causal LM for SmolLM2-135M-Instruct (its own 4-layer model)."""
DEFAULT_DRAFTER = MODEL_DRAFTER
PAIRS = ("smollm2", "tiny")
PairName = Literal["smollm2", "tiny"]


def default_models_dir() -> Path:
    return cache_root() / "models"


def default_pair(target: Path | None, drafter: Path | None, pair: str,
                 log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """The folders to serve: both given, else the named built-in pair (built on first use)."""
    if target and drafter:
        return target, drafter
    if pair not in PAIRS:
        raise ValueError(f"--pair must be one of {PAIRS}, got {pair!r}")
    if pair == "tiny":
        from cascade.tools.tiny_models import build_tiny_pair

        root = default_models_dir() / "tiny"
        if not all((root / name / "config.json").exists() for name in ("target", "drafter")):
            log("building the tiny model pair (first use only)")
        return build_tiny_pair(root)
    from cascade.tools.smollm import prepare

    return prepare(default_models_dir(), log=log), DEFAULT_DRAFTER


def default_target(target: Path | None, pair: str = "smollm2") -> Path:
    """``target``, else the built-in pair's target (for commands that take a target alone)."""
    return target or default_pair(None, None, pair)[0]


class PairSettings(BaseModel):
    """The model pair a command serves or measures: two folders, or a built-in pair (its flags:
    ``--target``, ``--drafter``, ``--pair``)."""

    model_config = ConfigDict(frozen=True)

    target: DirectoryPath | None = Field(None, description="Target model folder (default: from "
                                         "--pair).")
    drafter: DirectoryPath | None = Field(None, description="Drafter model folder (default: "
                                          "from --pair).")
    pair: PairName = Field("smollm2", description="Built-in pair when no "
                                             "folders are given: smollm2 (SmolLM2-135M-Instruct "
                                             "+ its distilled drafter) or tiny (random weights).")

    def folders(self, log: Callable[[str], None] = print) -> tuple[Path, Path]:
        """The pair's folders (a built-in pair is built or converted on first use)."""
        return default_pair(self.target, self.drafter, self.pair, log)
