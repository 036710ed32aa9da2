"""The gateway's settings, each declared once: its command line (``python -m gateway``) is
generated from this class (``cascade.serving.settings_cli``), tests and ``cascade up`` build it
by field name, and docs/deploy.md's and the manifests' flags are checked against it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from cascade.protocol.limits import MAX_DRAFT_TOKENS, MAX_TREE_NODES
from cascade.protocol.methods import DEFAULT_DRAFT_METHOD, DRAFT_METHODS
from cascade.protocol.request.mapping import ServerDefaults
from cascade.serving.memory_stream import DEFAULT_STREAM_BYTES, DEFAULT_STREAM_LEN, MemoryMode
from cascade.serving.mesh.security import SESSION_KEY_HELP, MeshSettings
from cascade.serving.settings_cli import borrowed, env
from gateway.sessions.assignment import OrchestratorSettings
from gateway.sessions.session_store import FINISHED_SESSION_TTL_S, SESSION_TTL_S
from gateway.sessions.sharing import PrefixSharing


def _known_method(value: str) -> str:
    if value not in DRAFT_METHODS:
        raise ValueError(f"must be one of {', '.join(sorted(DRAFT_METHODS))}")
    return value


DraftMethod = Annotated[str, AfterValidator(_known_method)]
"""A drafting method's name (``cascade.protocol.methods.DRAFT_METHODS``)."""


class GatewaySettings(BaseModel):
    """Serve the OpenAI-compatible HTTP API and the gRPC Generate stream."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="Target model folder (tokenizer, context length).")
    model_name: str = Field("", description="Model name clients send (default: folder name).")
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (OpenAI-compatible API).")
    grpc_port: int = Field(50050, ge=0, le=65535,
                           description="gRPC port (cascade.v1.Gateway; 0: any free port).")
    num_draft_tokens: int = Field(4, ge=0, le=MAX_DRAFT_TOKENS,
                                  description="Default drafted tokens per round (k).")
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens a request may ask.")
    api_keys: str = Field("", description="Comma-separated bearer keys; empty leaves the API "
                          "open.", json_schema_extra=env("CASCADE_API_KEYS"))
    allow_open: bool = Field(False, description="Serve without API keys (otherwise refused): "
                             "for local development.")
    grace_s: float = Field(30.0, ge=0, description="Seconds in-flight requests get after "
                           "SIGTERM.")
    playground: bool = Field(True, description="Serve the playground page at /playground/ "
                             "(turn it off in production).")
    round_timeout_s: float = Field(30.0, gt=0, description="Silence between rounds after which "
                                   "the session's pods are presumed hung and it moves (grows "
                                   "with the session's slowest round).")
    first_round_timeout_s: float = Field(120.0, gt=0, description="The same for the first round "
                                         "(prefill and KV admission wait).")
    mesh: MeshSettings = MeshSettings()
    session_key_file: Path | None = Field(None, description=SESSION_KEY_HELP,
                                          json_schema_extra=env("CASCADE_SESSION_KEY_FILE"))
    max_body_bytes: int = Field(1 << 20, ge=1, description="Largest HTTP request body (413 above "
                                "it) and gRPC request message (RESOURCE_EXHAUSTED).")
    max_sessions_per_key: int = Field(64, ge=0, description="Concurrent sessions one API key may "
                                      "run on this gateway (429 above it; 0: no limit).")
    tokens_per_minute_per_key: int = Field(0, ge=0, description="Tokens (prompt and generated) "
                                           "one API key's sessions may spend per minute on this "
                                           "gateway, each holding its prompt and max_tokens from "
                                           "its start (429 above it; 0: no limit).")
    session_lease_s: float = Field(10.0, gt=0, description="A session stays this gateway's this "
                                   "long after its last renewal; then another gateway may resume "
                                   "it.")
    tree_nodes: int = Field(0, ge=0, le=MAX_TREE_NODES, description="Default token-tree nodes per round for "
                            "requests that do not set draft_tree_nodes (0: chains; trees pay "
                            "where a many-token pass costs about one, as on GPUs).")
    speculation_memory: MemoryMode = Field(MemoryMode.PER_KEY, description="Whose finished "
                                           "generations the suffix draft methods draft from: "
                                           "per-key (each API key its own; see "
                                           "docs/security.md), shared (every key's) or off "
                                           "(none are shared).")
    draft_method: DraftMethod = Field(DEFAULT_DRAFT_METHOD, description="Drafting method of requests "
                              "that do not name one: auto (each round from whichever source "
                              "expects the most tokens per second: the speculation memory and "
                              "the session's own tokens, the client's predicted output, the "
                              "drafter model), model, ngram, ngram_then_model, suffix or "
                              "suffix_then_model. Requests that need the model's q (cascades, "
                              "the recursive rule, the adaptive schedule) use model.")
    redis_wait_replicas: int = Field(0, ge=0, description="Send a round to the client only once "
                                     "every Redis replica in sync, and at least this many, has "
                                     "it (WAIT, up to 8 s; with replicas and sentinels): a chunk "
                                     "a client saw then survives a failover whatever gateway "
                                     "the client resumes on. A round not acknowledged in time "
                                     "breaks the stream (the client resumes from what is "
                                     "replicated). 0: the primary's acknowledgement.")
    finished_session_ttl_s: int = Field(FINISHED_SESSION_TTL_S, ge=1, le=SESSION_TTL_S,
                                        description="Seconds Redis keeps a session that has "
                                        "ended (finished or failed), for clients that replay it "
                                        "after a dropped connection; one that can go on is kept "
                                        "an hour after its last write.")
    memory_stream_len: int = Field(DEFAULT_STREAM_LEN, ge=1, description="Finished generations "
                                   "the speculation memory's Redis stream keeps (the oldest are "
                                   "trimmed).")
    memory_stream_max_bytes: int = Field(DEFAULT_STREAM_BYTES, ge=1, description="Bytes the "
                                         "speculation memory's Redis stream keeps (4 a token; "
                                         "the oldest entries are trimmed): at most a quarter of "
                                         "Redis's maxmemory, which the gateway reads at its "
                                         "first append, whatever this says.")
    prefix_sharing: PrefixSharing = Field(PrefixSharing.PER_KEY, description="Whose live "
                                          "prompts a session's pods may copy KV prefixes from: "
                                          "per-key (the same API key's sessions only; see "
                                          "docs/security.md) or shared (every session: "
                                          "single-tenant deployments).")

    @model_validator(mode="after")
    def _needs_redis(self) -> GatewaySettings:
        if not self.mesh.redis_url:
            raise ValueError("--redis-url (or CASCADE_REDIS_URL) is required: Redis holds the "
                             "gateway's sessions")
        return self

    @property
    def redis_url(self) -> str:
        """The Redis holding sessions and the pod registry (``mesh.redis_url``, required)."""
        return self.mesh.redis_url or ""

    @property
    def keys(self) -> tuple[str, ...]:
        """The bearer keys clients must send (none: the API is open)."""
        return tuple(k.strip() for k in self.api_keys.split(",") if k.strip())

    def orchestrator(self, model_name: str) -> OrchestratorSettings:
        """The session orchestrator's settings these flags set (the rest its defaults)."""
        return OrchestratorSettings(first_round_timeout_s=self.first_round_timeout_s,
                                    round_timeout_s=self.round_timeout_s,
                                    memory=self.speculation_memory,
                                    memory_stream_len=self.memory_stream_len,
                                    memory_stream_bytes=self.memory_stream_max_bytes,
                                    model_name=model_name, prefix_sharing=self.prefix_sharing)


class HttpSettings(BaseModel):
    """What the HTTP layer knows of the served model and its limits: the model's name and
    context length, the keys, and the gateway's flags it reads, declared once in
    ``GatewaySettings`` and borrowed from there."""

    model_config = ConfigDict(frozen=True)

    model_name: str = Field(description="The one model served; requests naming another get "
                            "404 model_not_found.")
    context_length: int = Field(description="The target's context in tokens; prompt plus "
                                "max_tokens must fit in it.")
    api_keys: tuple[str, ...] = Field((), description="Accepted bearer keys; empty leaves the "
                                      "API open (local use).")
    num_draft_tokens: int = borrowed(GatewaySettings, "num_draft_tokens")
    max_tokens_limit: int = borrowed(GatewaySettings, "max_tokens_limit")
    playground: bool = borrowed(GatewaySettings, "playground")
    max_body_bytes: int = borrowed(GatewaySettings, "max_body_bytes")
    max_sessions_per_key: int = borrowed(GatewaySettings, "max_sessions_per_key")
    tokens_per_minute_per_key: int = borrowed(GatewaySettings, "tokens_per_minute_per_key")
    tree_nodes: int = borrowed(GatewaySettings, "tree_nodes")
    draft_method: DraftMethod = borrowed(GatewaySettings, "draft_method")

    @classmethod
    def of(cls, settings: GatewaySettings, model_name: str, context_length: int
           ) -> HttpSettings:
        own = {"model_name", "context_length", "api_keys"}  # the rest are borrowed flags
        return cls(model_name=model_name, context_length=context_length, api_keys=settings.keys,
                   **settings.model_dump(include=set(cls.model_fields) - own))

    def model_post_init(self, context: object) -> None:
        self.server_defaults(None)  # the one mapping checks the limits

    def server_defaults(self, eos_token_id: int | None) -> ServerDefaults:
        """The request defaults and limits ``build_request`` applies."""
        return ServerDefaults(self.context_length, self.max_tokens_limit, self.num_draft_tokens,
                              eos_token_id, self.tree_nodes, self.draft_method)
