"""Who may talk to the drafter and verifier ports: mutual TLS, a shared token, or both.

- **Mutual TLS**: every mesh member (gateway, drafters, verifiers) holds a certificate signed by
  one CA and checks its peer's against it. ``tls_dir`` holds ``tls.crt``, ``tls.key`` and
  ``ca.crt``: the layout of a cert-manager Secret, so such a Secret mounts as is. Pods are dialled
  by IP (the registry advertises pod IPs), so clients check the peer's certificate against one
  ``server_name`` every member's certificate carries, not against the address.
- **Shared token**: when TLS terminates elsewhere (a service mesh's sidecars), every call carries
  ``authorization: Bearer <token>`` and servers refuse calls without it (UNAUTHENTICATED). Health
  checks stay open: kubelet's gRPC probes send no metadata, and they reveal nothing.
- **Session owner tags**: with a session key (``--session-key-file``, given to gateways and
  verifiers, never to drafters) the gateway tags each session open with an HMAC of (session
  id, epoch); verifiers refuse opens without the right tag, so nobody who merely learns a session
  id (a drafter included) can open it with a higher epoch and fence out its owner. Drafters pass
  the tag on and cannot make one for another session or epoch.

With neither set the ports are open to anyone who can reach them (tests, local development);
``describe`` says which mode a process runs in, and it is logged at start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import grpc
import typer
from pydantic import BaseModel, ConfigDict, Field

from cascade.serving.errors import PermissionDenied, rewrapped
from cascade.serving.settings_cli import env

CERT, KEY, CA = "tls.crt", "tls.key", "ca.crt"
DEFAULT_SERVER_NAME = "cascade-mesh"
OPEN_METHODS = ("/grpc.health.v1.Health/",)
"""Methods served without the token (prefixes)."""


@dataclass(frozen=True)
class MeshSecurity:
    tls_dir: Path | None = None
    """Folder with tls.crt, tls.key and ca.crt (PEM); None: plaintext."""
    server_name: str = DEFAULT_SERVER_NAME
    """The name (a DNS SAN) clients expect in every member's certificate."""
    token: str | None = None
    """Shared bearer token every call carries and every pod requires; None: no token."""
    session_key: bytes | None = None
    """Key of session owner tags, held by gateways and verifiers only (not drafters)."""

    @classmethod
    def from_options(cls, tls_dir: Path | None, server_name: str | None,
                     token_file: Path | None) -> MeshSecurity:
        """From command-line options; checks the files now, so a bad path fails at start."""
        if tls_dir is not None:
            missing = [n for n in (CERT, KEY, CA) if not (Path(tls_dir) / n).is_file()]
            if missing:
                raise ValueError(f"--tls-dir {tls_dir} lacks {', '.join(missing)} (PEM files "
                                 "as in a cert-manager Secret)")
        token = None
        if token_file is not None:
            token = Path(token_file).read_text().strip()
            if len(token) < 16:
                raise ValueError(f"--mesh-token-file {token_file}: the token must be at least "
                                 "16 characters")
        return cls(Path(tls_dir) if tls_dir else None, server_name or DEFAULT_SERVER_NAME, token)

    def owner_tag(self, session_id: str, epoch: int) -> bytes:
        """The gateway's tag on (session, epoch); empty without a key."""
        key = self.session_key
        if key is None:
            return b""
        return hmac.new(key, f"{session_id}:{epoch}".encode(), hashlib.sha256).digest()

    def check_owner_tag(self, session_id: str, epoch: int, tag: bytes) -> None:
        """Raises PermissionDenied unless ``tag`` is the gateway's for (session, epoch)."""
        if self.session_key is None:
            return
        if not hmac.compare_digest(tag, self.owner_tag(session_id, epoch)):
            raise PermissionDenied(f"session {session_id!r} epoch {epoch}: missing or wrong "
                                   "owner_tag (only a gateway of this mesh opens sessions)")

    @property
    def is_authenticated(self) -> bool:
        """Callers must prove membership: mutual TLS, the token, or both."""
        return self.tls_dir is not None or self.token is not None

    def describe(self) -> str:
        parts = [f"mutual TLS (server name {self.server_name})"] if self.tls_dir else []
        parts += ["shared token"] if self.token else []
        return " + ".join(parts) or "OPEN (no TLS, no token)"

    def _read(self, name: str) -> bytes:
        if self.tls_dir is None:
            raise ValueError(f"no --tls-dir to read {name} from")
        return (self.tls_dir / name).read_bytes()

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_dir is None:
            return None
        return grpc.ssl_server_credentials([(self._read(KEY), self._read(CERT))],
                                           root_certificates=self._read(CA),
                                           require_client_auth=True)

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [TokenCheck(self.token)] if self.token else []

    def channel(self, address: str, options: list) -> grpc.aio.Channel:
        interceptors = token_senders(self.token) if self.token else None
        if self.tls_dir is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        credentials = grpc.ssl_channel_credentials(root_certificates=self._read(CA),
                                                   private_key=self._read(KEY),
                                                   certificate_chain=self._read(CERT))
        options = [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return grpc.aio.secure_channel(address, credentials, options=options,
                                       interceptors=interceptors)


OPEN = MeshSecurity()


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses every call (except health checks) without ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS):
            return handler
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(sent).encode(), self.expected):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "missing or wrong mesh token (authorization: Bearer <token>)")

    async def stream(request, context):
        await unary(request, context)
        yield  # pragma: no cover - makes this an async generator; abort raises first

    return rewrapped(handler, lambda _: unary, lambda _: stream)


def _with_token(details: grpc.aio.ClientCallDetails, value: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add("authorization", value)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                      details.credentials, details.wait_for_ready)


def token_senders(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that add the token to every kind of call."""
    value = f"Bearer {token}"

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(_with_token(details, value), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, details, request):
            return await continuation(_with_token(details, value), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, details, requests):
            return await continuation(_with_token(details, value), requests)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, details, requests):
            return await continuation(_with_token(details, value), requests)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


TLS_DIR_HELP = ("Mutual TLS on the mesh: a folder with tls.crt, tls.key and ca.crt (a "
                "cert-manager Secret mounted as is). Without it (and without a token) the port "
                "is open to anyone who reaches it.")
SERVER_NAME_HELP = "The DNS name every mesh member's certificate carries (default cascade-mesh)."
TOKEN_HELP = ("A file holding the shared mesh token: every call carries it and the pod refuses "
              "calls without it (for when TLS terminates elsewhere, e.g. a service mesh).")


SESSION_KEY_HELP = ("A file holding the key of session owner tags (gateways and verifiers only; "
                    "at least 16 characters): verifiers then open only sessions a gateway "
                    "tagged.")


def load_session_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    key = Path(path).read_bytes().strip()
    if len(key) < 16:
        raise ValueError(f"--session-key-file {path}: the key must be at least 16 bytes")
    return key


def mesh_or_exit(tls_dir: Path | None, server_name: str | None, token_file: Path | None,
                 session_key_file: Path | None = None) -> MeshSecurity:
    """The mesh settings, or a usage error that says which file is wrong."""
    try:
        mesh = MeshSecurity.from_options(tls_dir, server_name, token_file)
        return dataclasses.replace(mesh, session_key=load_session_key(session_key_file))
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc


class MeshSettings(BaseModel):
    """How a service meets the others (the flags every service shares): the Redis that holds
    the pod registry, and the mesh's credentials."""

    model_config = ConfigDict(frozen=True)

    redis_url: str | None = Field(None, description="Redis holding the pod registry (and the "
                                  "gateway's sessions; the gateway needs it). From the "
                                  "environment a password stays out of the process list.",
                                  json_schema_extra=env("CASCADE_REDIS_URL"))

    tls_dir: Path | None = Field(None, description=TLS_DIR_HELP,
                                 json_schema_extra=env("CASCADE_TLS_DIR"))
    tls_server_name: str | None = Field(None, description=SERVER_NAME_HELP,
                                        json_schema_extra=env("CASCADE_TLS_SERVER_NAME"))
    mesh_token_file: Path | None = Field(None, description=TOKEN_HELP,
                                         json_schema_extra=env("CASCADE_MESH_TOKEN_FILE"))

    def security(self, session_key_file: Path | None = None) -> MeshSecurity:
        """The mesh's credentials, or a usage error that says which file is wrong."""
        return mesh_or_exit(self.tls_dir, self.tls_server_name, self.mesh_token_file,
                            session_key_file)


def refuse_open(has_credentials: bool, allow_open: bool, what: str) -> None:
    """A service without credentials is a usage error unless ``--allow-open`` says it is meant
    (local development, or a proxy in front that authenticates)."""
    if has_credentials or allow_open:
        return
    raise typer.BadParameter(f"no {what} is set, so anyone who reaches this service could use "
                             "it: set them, or pass --allow-open if that is intended")
