"""The chaos suite's TCP proxy: bytes pass through; a drop resets the links of the process it
names (and only those) and refuses it for a while; a stall holds bytes until it ends; a Redis
primary and replicas behind proxies still fail over."""

import os
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from cascade.tools.fault_proxy import FaultProxy, local_ports
from cascade.tools.redis_ha import RedisHA


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    front = FaultProxy(server.server_address[1]).start()
    yield front
    front.stop()
    server.shutdown()
    server.server_close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    sock.settimeout(2)
    return sock


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def test_bytes_pass_through(proxy):
    with _connect(proxy.port) as sock:
        assert _echo(sock, b"hello") == b"hello"


def test_a_drop_resets_the_named_process_links_only(proxy):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with _connect(proxy.port) as mine:
            assert _echo(mine, b"a") == b"a"
            proxy.drop(0.5, pid=other.pid)  # not this process: nothing happens
            assert _echo(mine, b"b") == b"b"
            proxy.drop(0.5, pid=os.getpid())
            with pytest.raises(OSError):
                _echo(mine, b"c") or _echo(mine, b"c")
        with _connect(proxy.port) as refused:  # accepted by the proxy, then reset
            with pytest.raises(OSError):
                _echo(refused, b"d") or _echo(refused, b"d")
        time.sleep(0.6)
        with _connect(proxy.port) as again:
            assert _echo(again, b"e") == b"e"
    finally:
        other.kill()
        other.wait()


def test_a_stall_holds_bytes_until_it_ends(proxy):
    with _connect(proxy.port) as sock:
        assert _echo(sock, b"x") == b"x"
        proxy.stall(1.0)
        started = time.monotonic()
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(16)
        sock.settimeout(3)
        assert sock.recv(16) == b"held"
        assert time.monotonic() - started >= 0.9


def test_local_ports_names_a_process_sockets(proxy):
    with _connect(proxy.port) as sock:
        mine = sock.getsockname()[1]
        assert mine in local_ports(os.getpid())
        assert mine in local_ports(os.getpid(), proxy.port)
        assert mine not in local_ports(os.getpid(), proxy.upstream_port)  # not that peer's
    assert local_ports(2 ** 22 + 12345) == set()


def test_redis_behind_proxies_fails_over(tmp_path):
    proxies = {}

    def front(name: str, port: int) -> int:
        proxies[name] = FaultProxy(port).start()
        return proxies[name].port

    ha = RedisHA(tmp_path, replicas=2, password="pw", front=front).start()
    try:
        old = ha.primary_port()
        assert old == proxies["redis-0"].port  # everyone reaches the primary through its proxy
        client = ha.sync_client()
        client.set("k", "v")
        client.execute_command("WAIT", 2, 2000)
        ha.server_on(old).process.kill()
        new = ha.wait_for_failover(old)
        assert new in {p.port for p in proxies.values()} - {old}
        assert _eventually(lambda: client.get("k")) == b"v"  # once the sentinels agree
        client.close()
    finally:
        ha.stop()
        for p in proxies.values():
            p.stop()


def _eventually(call, timeout_s: float = 20.0):
    import redis

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
