"""Redis addresses the services take: ``redis://`` (and ``rediss://``, ``unix://``) for one
server, or ``redis+sentinel://`` for a primary with replicas watched by Sentinel, whose clients
follow the primary through a failover.

``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``: the sentinels to ask,
the name they monitor the primary under, and the database. The password is the data nodes'
and, unless ``?sentinel_password=`` says otherwise, the sentinels' too.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

SENTINEL_SCHEME = "redis+sentinel://"


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def parse_sentinel(url: str) -> SentinelAddress:
    """The parts of a ``redis+sentinel://`` URL; ValueError naming what is wrong."""
    if not is_sentinel(url):
        raise ValueError(f"not a {SENTINEL_SCHEME} URL")
    rest, _, query = url[len(SENTINEL_SCHEME):].partition("?")
    auth, _, hosts_path = rest.rpartition("@")
    hosts, _, path = hosts_path.partition("/")
    password = unquote(auth.partition(":")[2]) if auth else None
    sentinels = tuple(_host_port(h) for h in hosts.split(",") if h)
    parts = [p for p in path.split("/") if p]
    if not sentinels or not parts:
        raise ValueError(f"expected {SENTINEL_SCHEME}[:PASSWORD@]HOST:PORT[,HOST:PORT]/SERVICE"
                         "[/DB]")
    db = int(parts[1]) if len(parts) > 1 else 0
    options = parse_qs(query)
    sentinel_password = options.get("sentinel_password", [password])[0]
    return SentinelAddress(sentinels, parts[0], db, password or None, sentinel_password or None)


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"sentinel address {text!r} must be HOST:PORT")
    return host, int(port)
