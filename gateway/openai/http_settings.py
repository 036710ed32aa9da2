"""What the gateway's HTTP layer knows of the served model and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from cascade.protocol.methods import DEFAULT_DRAFT_METHOD
from cascade.protocol.requests import ServerDefaults


@dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """What the HTTP layer needs to know about the served model and its limits."""

    model_name: str
    """The one model served; requests naming another get 404 model_not_found."""
    context_length: int
    """The target model's context in tokens; prompt plus max_tokens must fit in it."""
    max_tokens_limit: int = 4096
    """Largest max_tokens a request may ask for (and the chat default when none is given)."""
    default_num_draft_tokens: int = 4
    """Drafted tokens per round when a request does not set num_draft_tokens."""
    api_keys: tuple[str, ...] = ()
    """Accepted bearer keys; empty leaves the API open (local use)."""
    playground: bool = True
    """Serve the playground page at /playground/ (gateway.playground)."""
    max_body_bytes: int = 1 << 20
    """Largest HTTP request body (413 above it), so no prompt is tokenized unboundedly."""
    max_sessions_per_key: int = 64
    """Concurrent sessions one API key may run on this gateway (429 above it); 0: no limit."""
    max_tokens_per_minute_per_key: int = 0
    """Tokens one API key's sessions may generate per minute on this gateway; 0: no limit."""
    default_tree_nodes: int = 0
    """Token-tree nodes per round when a request does not set draft_tree_nodes (0: chains)."""
    default_draft_method: str = DEFAULT_DRAFT_METHOD
    """The drafting method of requests that do not set draft_method (and can use it)."""

    def __post_init__(self) -> None:
        self.server_defaults(None)  # the one mapping checks the limits

    def server_defaults(self, eos_token_id: int | None) -> ServerDefaults:
        return ServerDefaults(self.context_length, self.max_tokens_limit,
                              self.default_num_draft_tokens, eos_token_id,
                              self.default_tree_nodes, self.default_draft_method)
