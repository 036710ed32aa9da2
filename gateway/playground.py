"""The playground page: a prompt box and settings, and a live view of each round (which drafted
tokens the verifier accepted, where it corrected them, how fast it went), beside a target-only
run on request.

Plain HTML, CSS and JavaScript from ``gateway/static`` (no build step, nothing fetched from
elsewhere). The page calls the public API with ``"cascade_rounds": true`` (gateway.openai.rounds), so it
needs nothing the API does not offer; ``settings.json`` tells it the model and the choices.
The page itself is public; its requests carry the API key the user types in, if any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.responses import RedirectResponse

from cascade.protocol.methods import DEFAULT_DRAFT_METHOD, DRAFT_METHODS
from cascade.protocol.request.options import CASCADE_RULE_NAMES
from cascade.protocol.limits import MAX_DRAFT_TOKENS

PATH = "/playground"
STATIC = Path(__file__).parent / "static"


def page_settings(model_name: str, default_num_draft_tokens: int,
                  max_tokens_limit: int, default_draft_method: str = DEFAULT_DRAFT_METHOD
                  ) -> dict[str, Any]:
    """What the page offers: the model, the draft methods and cascade rules, the defaults."""
    return {
        "model": model_name,
        "draft_methods": sorted(DRAFT_METHODS),
        "default_draft_method": default_draft_method,
        "cascade_rules": list(CASCADE_RULE_NAMES),
        "default_num_draft_tokens": default_num_draft_tokens,
        "max_draft_tokens": MAX_DRAFT_TOKENS,
        "max_tokens_limit": max_tokens_limit,
    }


def install_playground(app: FastAPI, settings: dict[str, Any]) -> None:
    """Serves the page at /playground/ and its settings at /playground/settings.json; ``/``
    leads there."""

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{PATH}/")

    @app.get(f"{PATH}/settings.json", include_in_schema=False)
    async def playground_settings() -> dict[str, Any]:
        return settings

    app.mount(PATH, StaticFiles(directory=STATIC, html=True), name="playground")


def is_playground(path: str) -> bool:
    """The page, its files and ``/`` (which leads to it) are public (the page holds no
    secrets)."""
    return path in ("/", PATH) or path.startswith(f"{PATH}/")
