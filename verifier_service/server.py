"""Build the verifier's gRPC service around a loaded target model."""

from __future__ import annotations

from cascade.core.sample import grammar
from cascade.core.model.runner import ModelRunner
from cascade.pod.process import model_executor
from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.serving.watchdog import ExecutorWatchdog
from cascade.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_service.scheduler import VerifierSettings
from verifier_service.servicer import VerifierServicer
from verifier_service.sessions import SessionTable

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


def build_verifier(runner: ModelRunner, host: str = "127.0.0.1", port: int = 0,
                   grace_s: float = 10.0, settings: VerifierSettings | None = None,
                   mesh: MeshSecurity = OPEN, step_cost=None) -> tuple[GrpcService, SessionTable]:
    """``step_cost``: the draft planner's pass-time model (default: the target's profile)."""
    grammar.prepare(runner)
    executor = model_executor()
    sessions = SessionTable(runner, executor, settings, step_cost)
    binding = ServiceBinding(verifier_pb2_grpc.add_VerifierServicer_to_server,
                             VerifierServicer(sessions, mesh), SERVICE_NAME)
    service = GrpcService([binding], host, port, grace_s, ExecutorWatchdog(executor), mesh)
    return service, sessions
