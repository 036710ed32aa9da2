"""The id a model is served under when no name is given (the gateway's model id, the pods'
``model_name`` metrics label)."""

from __future__ import annotations


def default_model_id(model: str) -> str:
    """A model folder's (or hub name's) last part."""
    return model.rstrip("/").split("/")[-1]
