"""Where Cascade keeps what it builds for a user: one cache root, the XDG rule."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/cascade``, else ``~/.cache/cascade``: the built model pairs
    (``models/``) and the verifiers' step-cost profiles (``step-cost/``) live under it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cascade"
