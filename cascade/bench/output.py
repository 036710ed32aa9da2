"""Where benchmarks write what they measured: a section of a markdown file, a JSON file."""

from __future__ import annotations

import json
from pathlib import Path


def write_section(path: Path, marker: str, text: str) -> None:
    """Replace the section ``marker`` (``<!-- name -->``) of the markdown file ``path`` with
    ``text``: what lies between it and its closing ``<!-- /name -->`` (or the end of the file
    when there is none), or a new section at the end. The file and its folder are made when
    missing, so a long run's results are never lost to a path."""
    closing = marker.replace("<!-- ", "<!-- /", 1)
    old = path.read_text() if path.exists() else ""
    before, found, rest = old.partition(marker)
    after = rest.partition(closing)[2] if found and closing in rest else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(before + marker + "\n" + text + closing + "\n" + after.lstrip("\n"))


def write_json(path: Path | None, data: object) -> None:
    """``data`` as JSON in ``path`` (its folder made), when a path is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
