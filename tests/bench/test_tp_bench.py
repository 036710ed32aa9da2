"""``cascade bench tp`` on a tiny Llama over two ranks (no speed assertions): every column of
every shape is measured, and the report states the sums a step makes."""

import copy

from rich.console import Console

from cascade.bench.step.tensor_parallel import TpBenchConfig, report, run_tp_bench
from models import tiny_llama
from tokenizers_fixture import build_tokenizer

COLUMNS = {"whole invariant, all cores", "whole invariant, one share", "whole plain, all cores",
           "whole plain, one share", "split invariant", "split plain", "sums alone"}


def test_every_column_is_a_positive_time(tmp_path):
    folder = tmp_path / "tiny-llama"
    copy.deepcopy(tiny_llama(seed=3).model).save_pretrained(folder)
    build_tokenizer(folder)
    config = TpBenchConfig(folder, repeats=1, rows=(1, 4), drafts=(4,), prefill=24, context=16,
                           out=tmp_path / "out")
    rows = run_tp_bench(config, Console(file=open("/dev/null", "w")))
    assert [r.shape for r in rows] == ["1 row x 1", "4 rows x 1", "1 row x 5 (draft 4)",
                                       "prefill 24"]
    assert [r.tokens for r in rows] == [1, 4, 5, 24]
    for row in rows:
        assert set(row.cells) == COLUMNS and all(v > 0 for v in row.cells.values())
    console = Console(width=300, record=True)
    assert [(r.sums, r.sum_bytes) for r in rows] == [(4, t * 64 * 4) for t in (1, 4, 5, 24)]
    console.print(report(config, rows))
    text = console.export_text()
    assert "4 x 6 KiB = 24 KiB" in text  # prefill: 2 sums per layer x 24 tokens x 64 x 4 bytes
    assert "split / whole" in text
