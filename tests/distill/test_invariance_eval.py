"""The invariance benchmark on the tiny pair: it runs both kinds of pass and the invariant one
is exact on every prompt and setting (no speed assertions)."""

import re

from cascade.distill.measure.invariance import report
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.tools.tiny_models import build_tiny_pair


def test_the_invariant_column_is_exact_everywhere(tmp_path):
    target_dir, drafter_dir = build_tiny_pair(tmp_path)
    target = ModelRunner.load(ModelSpec(str(target_dir), "bfloat16"))
    drafter = ModelRunner.load(ModelSpec(str(drafter_dir), "bfloat16"))
    prompts = [target.tokenizer(text).input_ids for text in ("def main():", "import os")]
    lines = report(target, drafter, prompts, 8, ("exactness",))
    rows = [line for line in lines if line.startswith("| ") and "/" in line]
    assert len(rows) == 3  # k = 1, k = 4, the batch
    for row in rows:
        plain, invariant = re.findall(r"(\d+)/(\d+)", row)
        assert invariant == ("2", "2") and plain[1] == "2"
