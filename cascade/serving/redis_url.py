"""Redis addresses the services take: ``redis://`` (and ``rediss://``, ``unix://``) for one
server, or ``redis+sentinel://`` for a primary with replicas watched by Sentinel, whose clients
follow the primary through a failover.

``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``: the sentinels to ask,
the name they monitor the primary under, and the database. The password is the data nodes'
and, unless ``?sentinel_password=`` says otherwise, the sentinels' too. It should be
percent-encoded; one whose ``@``, ``/``, ``?`` or ``#`` were not is still read whole where the
addresses after it show where it ends. An error never quotes the URL: it may hold the password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

SENTINEL_SCHEME = "redis+sentinel://"
_FORM = f"{SENTINEL_SCHEME}[:PASSWORD@]HOST:PORT[,HOST:PORT]/SERVICE[/DB]"
# The sentinel addresses and the path's slash: what follows the '@' that ends the password.
_ADDRESSES_THEN_PATH = re.compile(r"[^\s@/?#,]+:\d+(?:,[^\s@/?#,]+:\d+)*/")


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
    auth, rest = _split_userinfo(url[len(SENTINEL_SCHEME):])
    hosts_path, _, query = rest.partition("?")
    hosts, _, path = hosts_path.partition("/")
    password = unquote(auth.partition(":")[2]) if auth else None
    entries = hosts.split(",") if hosts else []
    sentinels = tuple(_host_port(h, i, len(entries)) for i, h in enumerate(entries, 1))
    parts = [p for p in path.split("/") if p]
    if not sentinels or not parts:
        raise ValueError(f"expected {_FORM}")
    if len(parts) > 1 and not parts[1].isdigit():
        raise ValueError(f"the DB of {_FORM} must be a number")
    db = int(parts[1]) if len(parts) > 1 else 0
    options = parse_qs(query)
    sentinel_password = options.get("sentinel_password", [password])[0]
    return SentinelAddress(sentinels, parts[0], db, password or None, sentinel_password or None)


def _split_userinfo(rest: str) -> tuple[str, str]:
    """(``[USER]:PASSWORD`` or "", the addresses and what follows). The password ends at the
    last '@' that the addresses and the path follow: the addresses never hold '@', so a password
    whose reserved characters were not percent-encoded is still read whole."""
    if "@" not in rest:
        return "", rest
    for at in reversed([i for i, char in enumerate(rest) if char == "@"]):
        if _ADDRESSES_THEN_PATH.match(rest, at + 1):
            return rest[:at], rest[at + 1:]
    if _ADDRESSES_THEN_PATH.match(rest):  # no password; an '@' in the query
        return "", rest
    raise ValueError(f"expected {_FORM}, each address HOST:PORT; percent-encode any @ / ? # "
                     "in the password")


def _host_port(text: str, number: int, count: int) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"sentinel address {number} of {count} must be HOST:PORT")
    return host, int(port)
