"""What ``cascade up`` starts (``cascade.tools.local_cluster``): the model pair, how many pods
of each role, their ports, threads and flags, Redis's replicas, and whether the mesh is secured."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MAX_PROCESSES_PER_ROLE = 16


@dataclass(frozen=True)
class ClusterConfig:
    target: Path
    drafter: Path
    num_drafters: int = 1
    http_port: int = 8000
    """The gateway's HTTP port; 0: a free one."""
    grpc_port: int = 50050
    """The gateway's gRPC port; 0: a free one."""
    dtype: str = "float32"
    workdir: Path = Path("runs/local")
    """Logs of every process and Redis's working folder."""
    threads_per_pod: int = 1
    """torch threads per drafter and verifier, so pods behave like separate machines."""
    verifier_args: tuple[str, ...] = ()
    """Extra flags for the verifier (e.g. --no-batching, --kv-tokens N)."""
    drafter_args: tuple[str, ...] = ()
    """Extra flags for every drafter (e.g. --inject-delay-ms 10)."""
    gateway_args: tuple[str, ...] = ()
    """Extra flags for the gateway (e.g. --session-lease-s 3)."""
    cpu_affinity: dict[str, frozenset[int]] = field(default_factory=dict)
    """CPU cores per process name ("verifier", "drafter-0", "gateway"); unlisted run anywhere
    (Linux only)."""
    num_verifiers: int = 1
    """Verifier processes: "verifier", then "verifier-1", "verifier-2", ..."""
    redis_replicas: int = 0
    """Redis replicas beside the primary, with three sentinels that fail over to one of them
    (the services get a redis+sentinel:// URL); 0: one Redis."""
    secure: bool = True
    """Mutual TLS between gateway, drafters and verifiers (a CA and certificate made at each
    start, in ``workdir/mesh``), a session key for owner tags (gateway and verifiers) and a Redis
    password made at each start: nothing else on the machine can reach into the pods or the
    session state."""

    def __post_init__(self) -> None:
        for name in ("num_drafters", "num_verifiers"):
            if not 1 <= getattr(self, name) <= MAX_PROCESSES_PER_ROLE:
                raise ValueError(f"{name} must be in [1, {MAX_PROCESSES_PER_ROLE}], "
                                 f"got {getattr(self, name)}")
        if not 0 <= self.redis_replicas <= MAX_PROCESSES_PER_ROLE:
            raise ValueError(f"redis_replicas must be in [0, {MAX_PROCESSES_PER_ROLE}], got "
                             f"{self.redis_replicas}")
