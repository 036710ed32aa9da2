"""Pass costs and planned sessions through real gRPC servers, for the tests of the "auto"
schedule (tests/services/test_planned_drafts.py, test_probes_and_shadows.py)."""

import grpc

from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.step_cost import StepShape
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.server import build_drafter
from models import random_prompts
from verifier_service.planner import DraftPlanner
from verifier_service.server import build_verifier


class Linear:
    def __init__(self, base: float, per_token: float) -> None:
        self.base, self.per_token = base, per_token

    def predict(self, shape: StepShape) -> float:
        return self.base + self.per_token * shape.num_tokens


STEEP = Linear(0.0001, 0.01)  # a pass costs by the token: a drafted token never pays, even
# always accepted (it would save a fixed part of 0.1 ms, less than any round trip)
CHEAP = Linear(0.5, 1e-6)  # wide passes are free: every drafted token pays, a busy
# machine's slower drafting included (its waits are small beside a 0.5 s pass)


async def planned_rounds(target, drafter, cost, prompt, params, k=4, tree_nodes=0):
    verifier, _ = build_verifier(target, grace_s=1.0, step_cost=cost)
    draft_service, _ = build_drafter(drafter, grace_s=1.0)
    await verifier.start()
    await draft_service.start()
    try:
        async with grpc.aio.insecure_channel(draft_service.address) as channel:
            request = drafter_pb2.RunSessionRequest(
                session_id="auto", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
                sampling=sampling_to_pb(params),
                draft=draft_settings_to_pb(DraftConfig(k, planned=True, tree_nodes=tree_nodes)),
                verifier_address=verifier.address)
            stub = drafter_pb2_grpc.DrafterStub(channel)
            return [r async for r in stub.RunSession(request, timeout=60)]
    finally:
        await draft_service.drain()
        await verifier.drain()


def lone_session(target, cost, seed: int, max_new_tokens: int, shadowed: bool = False):
    """A planner on ``cost``, an engine of the target and one greedy session enrolled with its
    "model" drafting method."""
    planner, engine = DraftPlanner(cost), VerifyEngine(target, kv_tokens=1024)
    prompt = random_prompts(1, seed=seed)[0]
    sequence = SequenceVerifier(target, prompt, SamplingParams(max_new_tokens=max_new_tokens),
                                engine=engine)
    planner.enroll(sequence, "model", shadowed=shadowed)
    return planner, engine, sequence
