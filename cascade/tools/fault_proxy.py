"""A TCP proxy on loopback in front of one server, with faults a test or the chaos suite turns
on: ``drop`` resets the connections and refuses new ones for a while (a link that died),
``stall`` stops forwarding bytes for a while (a link that hangs: nothing is lost, nothing
arrives). A fault applies to every connection, or only to those of one process (its pid: a
connection is that process's when its far end is one of the process's sockets), so one link of
a mesh breaks while the others run. The proxy runs its own event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import psutil

CHUNK = 65536
POLL_S = 0.02


@dataclass
class Fault:
    kind: str
    """"drop" or "stall"."""
    until: float
    """time.monotonic() when the fault ends."""
    pid: int | None = None
    """Only this process's connections (None: every connection)."""


def local_ports(pid: int, remote_port: int | None = None) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets (connected to ``remote_port``, if
    given; empty if the process is gone). A local port alone does not name a connection: the
    kernel reuses an ephemeral port for connections to different peers, so another process's
    connection to this proxy can have a port number this process uses elsewhere."""
    try:
        connections = psutil.Process(pid).net_connections("tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {c.laddr.port for c in connections
            if c.laddr and (remote_port is None or (c.raddr and c.raddr.port == remote_port))}


class _Link:
    """One proxied connection: its far end's port, both streams, and until when it stalls."""

    def __init__(self, peer_port: int, writers: list[asyncio.StreamWriter]) -> None:
        self.peer_port, self.writers = peer_port, writers
        self.stalled_until = 0.0

    def abort(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port, self.host = upstream_port, host
        self.port = 0
        self.faults: list[Fault] = []
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, self.host, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close(server: asyncio.AbstractServer) -> None:
            server.close()
            for link in list(self._links):
                link.abort()

        if self._server is not None:
            asyncio.run_coroutine_threadsafe(close(self._server), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def drop(self, seconds: float, pid: int | None = None) -> None:
        """Reset the connections (of ``pid``) now and refuse new ones for ``seconds``."""
        self._add(Fault("drop", time.monotonic() + seconds, pid))

    def stall(self, seconds: float, pid: int | None = None) -> None:
        """Forward no byte of the connections (of ``pid``) for ``seconds``."""
        self._add(Fault("stall", time.monotonic() + seconds, pid))

    def _add(self, fault: Fault) -> None:
        async def add() -> None:
            self.faults.append(fault)
            owned = self._owned(fault)
            for link in list(self._links):
                if owned is None or link.peer_port in owned:
                    self._apply(fault, link)

        asyncio.run_coroutine_threadsafe(add(), self._loop).result(10)

    def _owned(self, fault: Fault) -> set[int] | None:
        """The far-end ports of the connections ``fault`` applies to (None: all); looked up
        once per fault or accepted connection, never per byte (the proxy must stay fast for
        the links it does not fault)."""
        return None if fault.pid is None else local_ports(fault.pid, self.port)

    @staticmethod
    def _apply(fault: Fault, link: _Link) -> None:
        if fault.kind == "drop":
            link.abort()
        else:
            link.stalled_until = max(link.stalled_until, fault.until)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer.get_extra_info("peername")[1], [writer])
        now = time.monotonic()
        self.faults = [f for f in self.faults if f.until > now]
        for fault in self.faults:
            owned = self._owned(fault)
            if owned is None or link.peer_port in owned:
                self._apply(fault, link)
        if writer.transport.is_closing():  # dropped
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()  # the server is down: so is the link
            return
        link.writers.append(up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, link),
                                 self._pipe(up_reader, writer, link))
        finally:
            self._links.discard(link)
            link.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link) -> None:
        try:
            while data := await reader.read(CHUNK):
                while link.stalled_until > time.monotonic():
                    await asyncio.sleep(POLL_S)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.abort()
