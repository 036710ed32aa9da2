"""python -m gateway --model DIR --redis-url redis://... [--port 8000] [--grpc-port 50050]"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from cascade.protocol.methods import DEFAULT_DRAFT_METHOD, DRAFT_METHODS
from cascade.serving.memory_stream import DEFAULT_STREAM_BYTES, DEFAULT_STREAM_LEN, MemoryMode
from cascade.serving.mesh import SERVER_NAME_HELP, TLS_DIR_HELP, TOKEN_HELP, mesh_or_exit
from cascade.serving.mesh import SESSION_KEY_HELP, refuse_open
from cascade.serving.process import check_model, command_line, setup_logging
from cascade.serving.telemetry import setup_telemetry
from gateway.sessions.orchestrator import OrchestratorSettings
from gateway.server import GatewayConfig, serve
from gateway.sessions.session_store import FINISHED_SESSION_TTL_S, SESSION_TTL_S
from gateway.sessions.sharing import PrefixSharing

cli = command_line()


@cli.command()
def main(
    model: str = typer.Option(..., help="Target model folder (tokenizer, context length)."),
    redis_url: str = typer.Option(..., envvar="CASCADE_REDIS_URL", help="Redis holding "
                                  "sessions and the pod registry (from the environment, a "
                                  "password stays out of the process list)."),
    model_name: str = typer.Option("", help="Model name clients send (default: folder name)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="HTTP port (OpenAI-compatible API)."),
    grpc_port: int = typer.Option(50050, help="gRPC port (cascade.v1.Gateway)."),
    num_draft_tokens: int = typer.Option(4, help="Default drafted tokens per round (k)."),
    max_tokens_limit: int = typer.Option(4096, help="Largest max_tokens a request may ask."),
    api_keys: str = typer.Option("", envvar="CASCADE_API_KEYS",
                                 help="Comma-separated bearer keys; empty leaves the API open."),
    grace_s: float = typer.Option(30.0, help="Seconds in-flight requests get after SIGTERM."),
    playground: bool = typer.Option(True, help="Serve the playground page at /playground/ "
                                    "(turn it off in production)."),
    round_timeout_s: float = typer.Option(30.0, help="Silence between rounds after which the "
                                          "session's pods are presumed hung and it moves (grows "
                                          "with the session's slowest round)."),
    first_round_timeout_s: float = typer.Option(120.0, help="The same for the first round "
                                                "(prefill and KV admission wait)."),
    tls_dir: Path = typer.Option(None, envvar="CASCADE_TLS_DIR", help=TLS_DIR_HELP),
    tls_server_name: str = typer.Option(None, envvar="CASCADE_TLS_SERVER_NAME",
                                        help=SERVER_NAME_HELP),
    mesh_token_file: Path = typer.Option(None, envvar="CASCADE_MESH_TOKEN_FILE",
                                         help=TOKEN_HELP),
    session_key_file: Path = typer.Option(None, envvar="CASCADE_SESSION_KEY_FILE",
                                          help=SESSION_KEY_HELP),
    max_body_bytes: int = typer.Option(1 << 20, help="Largest HTTP request body (413 above "
                                       "it) and gRPC request message (RESOURCE_EXHAUSTED)."),
    max_sessions_per_key: int = typer.Option(64, help="Concurrent sessions one API key may run "
                                             "on this gateway (429 above it; 0: no limit)."),
    tokens_per_minute_per_key: int = typer.Option(0, help="Tokens (prompt and generated) one "
                                                  "API key's sessions may spend per minute on "
                                                  "this gateway, each holding its prompt and "
                                                  "max_tokens from its start (429 above it; 0: "
                                                  "no limit)."),
    session_lease_s: float = typer.Option(10.0, help="A session stays this gateway's this long "
                                          "after its last renewal; then another gateway may "
                                          "resume it."),
    allow_open: bool = typer.Option(False, help="Serve without API keys (otherwise refused): "
                                    "for local development."),
    tree_nodes: int = typer.Option(0, help="Default token-tree nodes per round for requests "
                                   "that do not set draft_tree_nodes (0: chains; trees pay where "
                                   "a many-token pass costs about one, as on GPUs)."),
    speculation_memory: MemoryMode = typer.Option(
        MemoryMode.PER_KEY.value, help="Whose finished generations the suffix draft methods "
        "draft from: per-key (each API key its own; see docs/security.md), shared (every "
        "key's) or off (none are shared)."),
    draft_method: str = typer.Option(
        DEFAULT_DRAFT_METHOD, help="Drafting method of requests that do not name one: auto "
        "(each round from whichever source expects the most tokens per second: the speculation "
        "memory and the session's own tokens, the client's predicted output, the drafter "
        "model), model, ngram, ngram_then_model, suffix or suffix_then_model. Requests that "
        "need the model's q (cascades, the recursive rule, the adaptive schedule) use model."),
    redis_wait_replicas: int = typer.Option(
        0, min=0, help="Send a round to the client only once every Redis replica in sync, and "
        "at least this many, has it (WAIT, up to 8 s; with replicas and sentinels): a chunk a client saw then survives "
        "a failover whatever gateway the client resumes on. A round not acknowledged in time "
        "breaks the stream (the client resumes from what is replicated). 0: the primary's "
        "acknowledgement."),
    finished_session_ttl_s: int = typer.Option(
        FINISHED_SESSION_TTL_S, min=1, max=SESSION_TTL_S, help="Seconds Redis keeps a session "
        "that has ended (finished or failed), for clients that replay it after a dropped "
        "connection; one that can go on is kept an hour after its last write."),
    memory_stream_len: int = typer.Option(
        DEFAULT_STREAM_LEN, help="Finished generations the speculation memory's Redis stream "
        "keeps (the oldest are trimmed)."),
    prefix_sharing: PrefixSharing = typer.Option(
        PrefixSharing.PER_KEY.value, help="Whose live prompts a session's pods may copy KV "
        "prefixes from: per-key (the same API key's sessions only; see docs/security.md) or "
        "shared (every session: single-tenant deployments)."),
    memory_stream_max_bytes: int = typer.Option(
        DEFAULT_STREAM_BYTES, min=1, help="Bytes the speculation memory's Redis stream keeps "
        "(4 a token; the oldest entries are trimmed): at most a quarter of Redis's maxmemory, "
        "which the gateway reads at its first append, whatever this says."),
) -> None:
    """Serve the OpenAI-compatible HTTP API and the gRPC Generate stream."""
    setup_logging()
    check_model(model)
    mesh = mesh_or_exit(tls_dir, tls_server_name, mesh_token_file, session_key_file)
    logging.getLogger("gateway").info("dials pods with %s", mesh.describe())
    setup_telemetry("cascade-gateway")
    if draft_method not in DRAFT_METHODS:
        raise typer.BadParameter(f"must be one of {', '.join(sorted(DRAFT_METHODS))}",
                                 param_hint="--draft-method")
    keys = tuple(k.strip() for k in api_keys.split(",") if k.strip())
    refuse_open(bool(keys), allow_open, "API keys (CASCADE_API_KEYS)")
    config = GatewayConfig(model, redis_url, model_name, host, port, grpc_port,
                           num_draft_tokens, max_tokens_limit, keys, grace_s, playground,
                           OrchestratorSettings(first_round_timeout_s=first_round_timeout_s,
                                                round_timeout_s=round_timeout_s,
                                                memory=speculation_memory,
                                                memory_stream_len=memory_stream_len,
                                                memory_stream_bytes=memory_stream_max_bytes,
                                                prefix_sharing=prefix_sharing), mesh,
                           max_body_bytes, max_sessions_per_key, tokens_per_minute_per_key,
                           session_lease_s, tree_nodes, draft_method, redis_wait_replicas,
                           finished_session_ttl_s=finished_session_ttl_s)
    asyncio.run(serve(config))


if __name__ == "__main__":
    cli()
