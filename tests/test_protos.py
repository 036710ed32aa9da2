import filecmp
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_current(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts/gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    fresh, committed = tmp_path / "cascade" / "v1", ROOT / "cascade" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in committed.iterdir() if p.suffix in {".py", ".pyi"})
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"run scripts/gen_protos.py: {mismatch + errors} differ"


def _quoted_in_comment_above(proto: str, declaration: str) -> set[str]:
    """The quoted words of the comment lines right above the field ``declaration``."""
    import re

    lines = (ROOT / "protos" / "cascade" / "v1" / proto).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(declaration))
    comment = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("//"):
            break
        comment.append(line)
    return set(re.findall(r'"([a-z_]+)"', " ".join(comment)))


def test_proto_comments_name_every_draft_method_and_source():
    """The comments that list the drafting methods and the block sources list exactly the
    registry's (they had drifted: two of five methods named)."""
    from cascade.protocol.methods import DRAFT_METHODS, DRAFT_SOURCES

    for proto, field in (("gateway.proto", "string draft_method = 12;"),
                         ("common.proto", "string method = 8;")):
        assert _quoted_in_comment_above(proto, field) == set(DRAFT_METHODS), (proto, field)
    for proto, field in (("common.proto", "string draft_source = 12;"),
                         ("verifier.proto", "string source = 11;")):
        assert _quoted_in_comment_above(proto, field) == set(DRAFT_SOURCES), (proto, field)


def test_round_stats_are_declared_once_and_agree_with_their_message():
    """The dataclass and the message have the same fields, in order, of matching kinds; the
    three messages that carry a round nest it instead of copying its fields."""
    from dataclasses import fields

    from google.protobuf.descriptor import FieldDescriptor

    from cascade.protocol.round_stats import RoundStats
    from cascade.v1 import common_pb2, gateway_pb2, verifier_pb2

    message = common_pb2.RoundStats.DESCRIPTOR
    names = [f.name for f in fields(RoundStats)]
    assert names == [f.name for f in message.fields]
    kinds = {FieldDescriptor.TYPE_STRING: str}
    for f in message.fields:
        assert isinstance(getattr(RoundStats(), f.name), kinds.get(f.type, int)), f.name
    for carrier in (common_pb2.Round, verifier_pb2.Verdict, gateway_pb2.GenerateResponse):
        own = {f.name for f in carrier.DESCRIPTOR.fields}
        assert carrier.DESCRIPTOR.fields_by_name["stats"].message_type is message
        assert not own & set(names), (carrier.DESCRIPTOR.name, own & set(names))


def test_round_stats_cross_the_wire_and_reach_json_whole():
    from dataclasses import fields

    from cascade.protocol.round_stats import RoundStats
    from cascade.v1 import common_pb2

    values = {f.name: (f"s{i}" if f.type is str or f.type == "str" else i + 1)
              for i, f in enumerate(fields(RoundStats))}
    values["speculation"] = common_pb2.SPECULATION_AHEAD_HIT
    stats = RoundStats(**values)
    wire = common_pb2.RoundStats.FromString(stats.to_pb().SerializeToString())
    assert RoundStats.from_pb(wire) == stats
    shown = stats.to_json()
    assert len(shown) == len(values) and shown["block"] == "ahead_hit"
    assert shown["draft_ms"] == values["draft_us"] / 1000
    assert shown["num_accepted"] == values["num_accepted"]


def test_every_generate_request_field_is_an_option_of_the_same_name_or_the_servicers():
    """The gRPC servicer converts options by name: a field added to one side and not the
    other fails here, not in a client's request."""
    from cascade.protocol.request.options import GenerationOptions
    from cascade.v1 import gateway_pb2
    from gateway.grpc_api import REQUEST_FIELDS

    names = {f.name for f in gateway_pb2.GenerateRequest.DESCRIPTOR.fields}
    assert set(GenerationOptions.model_fields) == names - set(REQUEST_FIELDS)


def test_a_generate_requests_options_arrive_by_name():
    from cascade.v1 import gateway_pb2
    from gateway.grpc_api import options_fields

    msg = gateway_pb2.GenerateRequest(model="m", prompt="p", temperature=0.0, top_k=5,
                                      stop=["\n"], logit_bias={"7": -100.0}, draft_method="ngram",
                                      prediction="abc", max_tokens=3)
    assert options_fields(msg) == {
        "temperature": 0.0, "top_k": 5, "stop": ["\n"], "logit_bias": {"7": -100.0},
        "draft_method": "ngram", "prediction": {"type": "content", "content": "abc"}}
    assert options_fields(gateway_pb2.GenerateRequest(acceptance="")) == {}
