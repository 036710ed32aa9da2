"""The failures the fuzzers found, kept as plain cases so they stay fixed whatever examples a
run happens to draw."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cascade.pod.messages import draft_from_pb
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.wire.validation import ModelLimits, check_feature_layers, session_settings
from cascade.v1 import common_pb2, verifier_pb2
from gateway.openai.errors import APIError
from gateway.http_app import create_app
from gateway.resume import resume_after
from gateway_requests import HTTP_SETTINGS, MODEL, RecordingGenerator


@pytest.fixture(scope="module")
def http(tokenizer):
    with TestClient(create_app(HTTP_SETTINGS, tokenizer, RecordingGenerator([1])),
                    raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(("path", "raw", "status", "param", "says"), [
    ("/v1/completions", b"\x80", 400, None, "request body"),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400, None, "request body"),
    ("/v1/completions", b'{"model": "\\ud800", "prompt": "hi"}', 404, "model", "\\ud800"),
    ("/v1/chat/completions", b'{"model": "%s", "max_completion_tokens": -1, "messages": '
     b'[{"role": "user", "content": "hi"}]}' % MODEL.encode(), 400, "max_completion_tokens",
     "max_completion_tokens"),
])
def test_http_errors_found_by_fuzzing(http, path, raw, status, param, says):
    response = http.post(path, content=raw, headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (status, param)
    assert says in error["message"]


@pytest.mark.parametrize("last_event_id", [b"s1.\xb2", "s1.\u0661".encode()])
def test_a_non_ascii_digit_in_last_event_id_is_a_400(last_event_id):
    """'²' and Arabic-Indic digits pass str.isdigit but not int(): was a 500."""
    with pytest.raises(APIError) as refused:
        resume_after("s1", last_event_id.decode("latin-1"), None)
    assert (refused.value.status_code, refused.value.param) == (400, "Last-Event-ID")


def test_a_huge_block_is_refused_before_any_tensor_is_built():
    """32 proposals of 2^20 ids: padded to [32, 2^20] they took 400 MB before the check."""
    wide = verifier_pb2.SparseDistribution(token_ids=range(2**20), probs=[0.0] * 2**20)
    block = verifier_pb2.DraftBlock(tokens=[1] * 32, proposals=[wide] * 32)
    with pytest.raises(RequestInvalid, match=r"^proposals\[0\]\.token_ids: must hold 1 to 96"):
        draft_from_pb(block, vocab_size=96)


@pytest.mark.parametrize(("change", "field"), [
    ({"feature_layers": [4]}, "feature_layers"),  # was an IndexError in the pass: INTERNAL
    ({"context_tokens": [96]}, "context_tokens"),  # the drafter's embedding: INTERNAL
    ({"context_tokens": []}, "context_tokens"),  # the drafter's first pass: INTERNAL
    ({"acceptance": common_pb2.Acceptance(alpha=float("nan"))}, "acceptance"),  # was ignored
])
def test_session_fields_found_by_fuzzing(change, field):
    fields = dict(session_id="s", context_tokens=[1, 2], prompt_len=1,
                  sampling=common_pb2.Sampling(top_p=1.0, max_new_tokens=4))
    fields.update(change)
    message = verifier_pb2.SessionOpen(**fields)
    limits = ModelLimits(vocab_size=96, max_length=256, num_layers=3)
    with pytest.raises(RequestInvalid) as refused:
        session_settings(message, limits)
        check_feature_layers(message.feature_layers, limits.num_layers)
    assert refused.value.param == field
