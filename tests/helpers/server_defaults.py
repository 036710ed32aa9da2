"""The request mapping's defaults for tests: the gateway's own flag defaults
(``gateway.settings.HttpSettings``, declared once in ``GatewaySettings``), with what a test
changes."""

from __future__ import annotations

from cascade.protocol.request.mapping import ServerDefaults
from gateway.settings import HttpSettings


def server_defaults(context_length: int, eos_token_id: int | None = None,
                    **flags) -> ServerDefaults:
    """``flags``: the gateway's request flags by field name (``max_tokens_limit``,
    ``num_draft_tokens``, ``tree_nodes``, ``draft_method``)."""
    settings = HttpSettings(model_name="test", context_length=context_length, **flags)
    return settings.server_defaults(eos_token_id)
