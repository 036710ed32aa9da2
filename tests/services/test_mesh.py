"""The mesh's access control on real loopback servers: mutual TLS with certificates made here,
the shared token, and the drafter's verifier allow-list."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.wire.convert import draft_settings_to_pb, sampling_to_pb
from cascade.serving.mesh.certs import make_mesh_certs, new_authority, write_member
from cascade.serving.channels import CHANNEL_OPTIONS
from cascade.serving.mesh.security import MeshSecurity
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.server import build_drafter
from drafter_service.verifiers import VerifierPolicy
from models import hf_greedy, random_prompts
from verifier_service.server import build_verifier

TOKEN = "a-shared-mesh-token-for-tests"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_mesh_certs(tmp_path_factory.mktemp("mesh"))


async def started(gpt2_pair, mesh, verifiers=None):
    target, drafter = gpt2_pair
    verifier, _ = build_verifier(target, grace_s=1.0, mesh=mesh)
    draft_service, _ = build_drafter(drafter, grace_s=1.0, mesh=mesh, verifiers=verifiers)
    await verifier.start()
    await draft_service.start()
    return verifier, draft_service


async def stopped(*services):
    for service in services:
        await service.drain()


def session_request(verifier_address, prompt, k=4, max_new_tokens=16):
    return drafter_pb2.RunSessionRequest(
        session_id="m1", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=max_new_tokens)),
        draft=draft_settings_to_pb(DraftConfig(k)), verifier_address=verifier_address)


async def run_session(channel, verifier_address, prompt):
    stub = drafter_pb2_grpc.DrafterStub(channel)
    rounds = [r async for r in stub.RunSession(session_request(verifier_address, prompt),
                                               timeout=60)]
    return [t for r in rounds for t in r.tokens]


async def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code()


async def test_mutual_tls_serves_members_exactly_and_refuses_everyone_else(gpt2_pair, certs,
                                                                         tmp_path):
    mesh = MeshSecurity(tls_dir=certs)
    verifier, draft_service = await started(gpt2_pair, mesh)
    try:
        prompt = random_prompts(1, seed=41)[0]
        async with mesh.channel(draft_service.address, CHANNEL_OPTIONS) as channel:
            tokens = await run_session(channel, verifier.address, prompt)
        assert tokens == hf_greedy(gpt2_pair[0], prompt)[:16]  # drafter -> verifier over TLS too

        request = session_request(verifier.address, prompt)
        async with grpc.aio.insecure_channel(draft_service.address) as plain:
            stream = drafter_pb2_grpc.DrafterStub(plain).RunSession(request, timeout=10)
            assert await code_of(stream.read()) == grpc.StatusCode.UNAVAILABLE
        stranger = MeshSecurity(tls_dir=write_member(new_authority(), tmp_path / "other"))
        async with stranger.channel(draft_service.address, CHANNEL_OPTIONS) as foreign:
            stream = drafter_pb2_grpc.DrafterStub(foreign).RunSession(request, timeout=10)
            assert await code_of(stream.read()) == grpc.StatusCode.UNAVAILABLE
        misnamed = MeshSecurity(tls_dir=certs, server_name="someone-else")
        async with misnamed.channel(verifier.address, CHANNEL_OPTIONS) as wrong_name:
            check = health_pb2_grpc.HealthStub(wrong_name).Check(health_pb2.HealthCheckRequest(),
                                                                 timeout=10)
            assert await code_of(check) == grpc.StatusCode.UNAVAILABLE
    finally:
        await stopped(draft_service, verifier)


async def test_the_shared_token_is_required_except_for_health_checks(gpt2_pair):
    mesh = MeshSecurity(token=TOKEN)
    verifier, draft_service = await started(gpt2_pair, mesh)
    try:
        prompt = random_prompts(1, seed=42)[0]
        async with mesh.channel(draft_service.address, CHANNEL_OPTIONS) as channel:
            assert await run_session(channel, verifier.address, prompt) == \
                hf_greedy(gpt2_pair[0], prompt)[:16]
        for token in (None, "a-wrong-token-of-enough-length"):
            guess = MeshSecurity(token=token)
            async with guess.channel(draft_service.address, CHANNEL_OPTIONS) as channel:
                stream = drafter_pb2_grpc.DrafterStub(channel).RunSession(
                    session_request(verifier.address, prompt), timeout=10)
                assert await code_of(stream.read()) == grpc.StatusCode.UNAUTHENTICATED
                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=10)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await stopped(draft_service, verifier)


async def test_a_drafter_dials_only_allowed_verifiers(gpt2_pair):
    verifier, _ = build_verifier(gpt2_pair[0], grace_s=1.0)
    await verifier.start()
    policy = VerifierPolicy(allowed=(verifier.address,))
    draft_service, _ = build_drafter(gpt2_pair[1], grace_s=1.0, verifiers=policy)
    await draft_service.start()
    try:
        prompt = random_prompts(1, seed=43)[0]
        async with grpc.aio.insecure_channel(draft_service.address) as channel:
            assert await run_session(channel, verifier.address, prompt) == \
                hf_greedy(gpt2_pair[0], prompt)[:16]
            stream = drafter_pb2_grpc.DrafterStub(channel).RunSession(
                session_request("127.0.0.1:9", prompt), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "verifier_address" in caught.value.details()
        assert "not a registered verifier" in caught.value.details()
    finally:
        await stopped(draft_service, verifier)


def test_bad_mesh_files_are_refused_at_start(tmp_path, certs):
    with pytest.raises(ValueError, match="lacks tls.crt, tls.key, ca.crt"):
        MeshSecurity.from_options(tmp_path, None, None)
    short = tmp_path / "token"
    short.write_text("short\n")
    with pytest.raises(ValueError, match="at least 16 characters"):
        MeshSecurity.from_options(None, None, short)
    short.write_text(TOKEN + "\n")
    mesh = MeshSecurity.from_options(certs, None, short)
    assert mesh.token == TOKEN and mesh.describe() == \
        "mutual TLS (server name cascade-mesh) + shared token"
    assert MeshSecurity().describe().startswith("OPEN")


async def test_a_plaintext_health_port_answers_probes_and_nothing_else(gpt2_pair, certs):
    from cascade.v1 import verifier_pb2, verifier_pb2_grpc

    verifier, _ = build_verifier(gpt2_pair[0], grace_s=1.0, mesh=MeshSecurity(tls_dir=certs))
    verifier.health_port = 0
    await verifier.start()
    try:
        assert verifier.health_port not in (0, verifier.port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{verifier.health_port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stream = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=10)
            await stream.write(verifier_pb2.VerifyRequest())
            assert await code_of(stream.read()) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await verifier.drain()


async def test_a_verifier_with_a_session_key_opens_only_sessions_a_gateway_tagged(gpt2_pair):
    gateway = MeshSecurity(session_key=b"a-session-key-for-tests")
    verifier, _ = build_verifier(gpt2_pair[0], grace_s=1.0, mesh=gateway)
    draft_service, _ = build_drafter(gpt2_pair[1], grace_s=1.0)  # no key: it cannot make tags
    await verifier.start()
    await draft_service.start()
    try:
        prompt = random_prompts(1, seed=44)[0]
        async with grpc.aio.insecure_channel(draft_service.address) as channel:
            stub = drafter_pb2_grpc.DrafterStub(channel)
            tagged = session_request(verifier.address, prompt)
            tagged.owner_tag = gateway.owner_tag(tagged.session_id, tagged.epoch)
            rounds = [r async for r in stub.RunSession(tagged, timeout=60)]
            assert [t for r in rounds for t in r.tokens] == hf_greedy(gpt2_pair[0], prompt)[:16]
            stolen = gateway.owner_tag(tagged.session_id, tagged.epoch)
            for epoch, tag in ((1, b""), (tagged.epoch + 1000, stolen)):  # none; another epoch's
                forged = session_request(verifier.address, prompt)
                forged.epoch, forged.owner_tag = epoch, tag
                stream = stub.RunSession(forged, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stream.read()
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "owner_tag" in caught.value.details()
    finally:
        await stopped(draft_service, verifier)
