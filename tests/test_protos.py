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
    for proto, field in (("gateway.proto", "string draft_source = 19;"),
                         ("common.proto", "string draft_source = 17;"),
                         ("verifier.proto", "string source = 11;")):
        assert _quoted_in_comment_above(proto, field) == set(DRAFT_SOURCES), (proto, field)
