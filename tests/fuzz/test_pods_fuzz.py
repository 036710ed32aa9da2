"""Malformed and extreme protobuf messages against a real verifier and a real drafter (gRPC on
loopback, tiny GPT-2 models): every one is answered with a status that is not a server fault,
every INVALID_ARGUMENT names the field, a valid message still succeeds, and both servers keep
serving afterwards."""

from __future__ import annotations

import grpc
import pytest

from cascade.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from drafter_service.server import build_drafter
from harness import (
    SERVER_FAULTS,
    SLOW_EXAMPLES_SCALE,
    BackgroundLoop,
    assert_names_a_field,
    field_pattern,
    run_fuzz,
)
from pod_messages import Fuzzed, run_session_requests, verify_streams, with_fresh_session_id
from verifier_service.server import build_verifier

TIMEOUT_S = 30.0
VERIFY_EXAMPLES = 300
RUN_SESSION_EXAMPLES = 150
VERIFIER_FIELDS = field_pattern("session_id", "context_tokens", "prompt_len", "sampling",
                                "acceptance", "feature_layers", "tokens", "proposals", "block",
                                "open")
DRAFTER_FIELDS = field_pattern("session_id", "context_tokens", "prompt_len", "sampling",
                               "acceptance", "draft", "verifier_address")


class Pods:
    """A verifier and a drafter serving on a background loop, and stubs to call them."""

    def __init__(self, gpt2_pair) -> None:
        target, drafter = gpt2_pair
        self.background = BackgroundLoop()
        self.verifier, _ = build_verifier(target, grace_s=1.0)
        self.drafter, _ = build_drafter(drafter, grace_s=1.0)
        for service in (self.verifier, self.drafter):
            self.background.run(service.start())
        self.channels = [grpc.insecure_channel(s.address) for s in (self.verifier, self.drafter)]
        self.verify = verifier_pb2_grpc.VerifierStub(self.channels[0]).Verify
        self.run_session = drafter_pb2_grpc.DrafterStub(self.channels[1]).RunSession

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        for service in (self.drafter, self.verifier):
            self.background.run(service.drain())
        self.background.close()


@pytest.fixture(scope="module")
def pods(gpt2_pair):
    running = Pods(gpt2_pair)
    yield running
    running.close()


def assert_refused(error: grpc.RpcError, fuzzed: Fuzzed, fields) -> None:
    """A malformed message's refusal: INVALID_ARGUMENT naming the field, never a fault. (A
    broken session id that an earlier example used at a higher epoch is fenced off instead.)"""
    assert error.code() not in SERVER_FAULTS, (error.code(), error.details(), fuzzed)
    if error.code() == grpc.StatusCode.FAILED_PRECONDITION and "session_id" in fuzzed.broken:
        return
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    assert fuzzed.broken, f"a valid message was refused: {error.details()} {fuzzed}"
    assert_names_a_field(error.details(), fields)


def check_verify_stream(pods: Pods, example: tuple[Fuzzed, Fuzzed | None]) -> None:
    opened, block = example
    with_fresh_session_id(opened.message, *([block.message] if block else []))
    requests = [verifier_pb2.VerifyRequest(open=opened.message)]
    if block is not None:
        requests.append(verifier_pb2.VerifyRequest(block=block.message))
    try:
        replies = list(pods.verify(iter(requests), timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        culprit = opened if block is None else Fuzzed(block, block.broken - {"stale"})
        assert_refused(error, culprit, VERIFIER_FIELDS)
        return
    if block is not None:
        assert_verdict(replies, opened.message, block)


def assert_verdict(replies: list, opened: verifier_pb2.SessionOpen, block: Fuzzed) -> None:
    """One verdict for the block: stale when it was made stale, else within the limits."""
    assert len(replies) == 1, replies
    verdict, drafted = replies[0], len(block.message.tokens)
    assert verdict.is_stale == ("stale" in block.broken)
    if not verdict.is_stale:
        assert verdict.stats.num_accepted <= drafted and 1 <= len(verdict.tokens) <= drafted + 1
        assert verdict.committed_len == len(opened.context_tokens) + len(verdict.tokens)


def check_run_session(pods: Pods, fuzzed: Fuzzed) -> None:
    request = fuzzed.message
    with_fresh_session_id(request)
    try:
        rounds = list(pods.run_session(request, timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNAVAILABLE:  # a well-formed address nobody serves
            assert request.verifier_address != pods.verifier.address, error.details()
            return
        assert_refused(error, fuzzed, DRAFTER_FIELDS)
        return
    generated = [token for r in rounds for token in r.tokens]
    assert rounds and rounds[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
    assert len(generated) <= request.sampling.max_new_tokens


def assert_still_serving(pods: Pods) -> None:
    """A valid session after the fuzzing: the drafter and the verifier both still work."""
    request = drafter_pb2.RunSessionRequest(
        session_id="after-fuzzing", epoch=1, context_tokens=[1, 2, 3], prompt_len=3,
        sampling=common_pb2.Sampling(top_p=1.0, max_new_tokens=5),
        draft=common_pb2.DraftSettings(num_draft_tokens=2, max_proposal_tokens=8),
        verifier_address=pods.verifier.address)
    rounds = list(pods.run_session(request, timeout=TIMEOUT_S))
    assert sum(len(r.tokens) for r in rounds) == 5


def fuzz_verifier(pods: Pods, examples: int) -> None:
    sent = run_fuzz(verify_streams(), lambda e: check_verify_stream(pods, e), examples)
    assert sent == examples
    assert_still_serving(pods)


def fuzz_drafter(pods: Pods, examples: int) -> None:
    strategy = run_session_requests(pods.verifier.address)
    sent = run_fuzz(strategy, lambda e: check_run_session(pods, e), examples)
    assert sent == examples
    assert_still_serving(pods)


def test_verifier_refuses_malformed_opens_and_blocks(pods):
    fuzz_verifier(pods, VERIFY_EXAMPLES)


def test_drafter_refuses_malformed_sessions(pods):
    fuzz_drafter(pods, RUN_SESSION_EXAMPLES)


@pytest.mark.slow
def test_verifier_long_fuzz(pods):
    fuzz_verifier(pods, VERIFY_EXAMPLES * SLOW_EXAMPLES_SCALE)


@pytest.mark.slow
def test_drafter_long_fuzz(pods):
    fuzz_drafter(pods, RUN_SESSION_EXAMPLES * SLOW_EXAMPLES_SCALE)
