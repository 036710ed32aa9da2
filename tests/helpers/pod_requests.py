"""Requests to a drafter's and a verifier's gRPC ports, as the services' tests send them."""

import grpc

from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2


async def run_session(draft_address, verifier_address, prompt, params, k, epoch=1):
    async with grpc.aio.insecure_channel(draft_address) as channel:
        stub = drafter_pb2_grpc.DrafterStub(channel)
        request = drafter_pb2.RunSessionRequest(
            session_id="s1", epoch=epoch, context_tokens=prompt, prompt_len=len(prompt),
            sampling=sampling_to_pb(params), draft=draft_settings_to_pb(DraftConfig(k)),
            verifier_address=verifier_address)
        return [r async for r in stub.RunSession(request, timeout=60)]


def open_request(prompt, epoch):
    return verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
        session_id="s2", epoch=epoch, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=10))))


def block_request(epoch, round_number, base_len, tokens):
    return verifier_pb2.VerifyRequest(block=verifier_pb2.DraftBlock(
        session_id="s2", epoch=epoch, round=round_number, base_len=base_len, tokens=tokens))
