"""Proposers: the drafting methods, one class each, chosen by name.

``cascade.protocol.methods.DRAFT_METHODS`` names every method and where its class lives; ``load``
imports it. A proposer instance drafts for one sequence and keeps that sequence's state.
"""

from __future__ import annotations

import importlib

from cascade.core.proposers.base import (
    EstimatesOwnDrafts,
    Guesses,
    Proposer,
    ProposerContext,
    TargetFeatures,
    guesser,
    shadow_drafter,
)
from cascade.protocol.methods import DRAFT_METHODS

__all__ = ["EstimatesOwnDrafts", "Guesses", "Proposer", "ProposerContext", "TargetFeatures",
           "guesser", "load", "new_proposer", "shadow_drafter"]


def load(method: str) -> type[Proposer]:
    """The Proposer subclass registered for ``method``."""
    if method not in DRAFT_METHODS:
        raise ValueError(f"draft method must be one of {sorted(DRAFT_METHODS)}, got {method!r}")
    module_name, class_name = DRAFT_METHODS[method].split(":")
    proposer = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(proposer, Proposer), f"{DRAFT_METHODS[method]} is not a Proposer"
    return proposer


def new_proposer(context: ProposerContext) -> Proposer:
    """A proposer for one sequence, of the method its draft settings name."""
    return load(context.config.method)(context)
