"""Options every command that serves or measures a pair shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cascade.tools.pairs import default_pair

console = Console()

FOLDER: dict[str, Any] = dict(exists=True, file_okay=False)
"""A model folder option: one that is not there is a usage error naming it."""
TARGET_OPT = typer.Option(None, help="Target model folder (default: from --pair).", **FOLDER)
DRAFTER_OPT = typer.Option(None, help="Drafter model folder (default: from --pair).", **FOLDER)
PAIR_OPT = typer.Option("smollm2", help="Built-in pair when no folders are given: smollm2 "
                        "(SmolLM2-135M-Instruct + its distilled drafter) or tiny (random weights).")


def draft_tokens_option(default: int, help: str = "Drafted tokens per round.", **limits):
    """The draft length under the API's name (``num_draft_tokens``, the gateway's
    --num-draft-tokens), --k kept as its short form."""
    return typer.Option(default, "--num-draft-tokens", "--k", help=help, **limits)


def pair_folders(target: Path | None, drafter: Path | None, pair: str) -> tuple[Path, Path]:
    """The pair's folders; a bad --pair is a usage error."""
    try:
        with console.status(f"preparing the {pair} pair (first use only)"):
            return default_pair(target, drafter, pair, log=console.print)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
