"""``cascade bench engine`` on a tiny Llama (no speed assertions): every cell is measured, the
floor multiplies as many rows as the step feeds, the tables name every shape."""

import copy
import json

import pytest
from models import tiny_llama
from tokenizers_fixture import build_tokenizer

from cascade.bench.step.engine import EngineBenchConfig, run_engine_bench
from cascade.bench.step.columns import floor_inputs
from cascade.bench.step.report import markdown, save, table


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(seed=3).model.save_pretrained(folder)
    build_tokenizer(folder)  # ModelRunner.load wants one; the bench feeds token ids
    config = EngineBenchConfig(folder, threads=1, repeats=1, context=24, hf_compile=False,
                               rows=(1, 4), drafts=(4,), tree=(-1, -1, 0, 0, 1),
                               prefill=40, bandwidth_mib=64, engine_compile=False)
    seen = []
    bench = run_engine_bench(config, lambda description, done, total: seen.append(
        (description, done, total)))
    return config, bench, seen


def test_every_cell_is_a_positive_time(result):
    config, bench, _ = result
    assert [d.dtype for d in bench.dtypes] == ["float32", "bfloat16"]
    for dtype in bench.dtypes:
        assert [r.shape for r in dtype.shapes] == config.shapes()
        assert dtype.compile_error is None and dtype.weight_bytes > 0
        for r in dtype.shapes:
            cells = (r.plain_ms, r.invariant_ms, r.eager_ms, r.floor_ms, r.bandwidth_ms)
            assert all(c > 0 for c in cells), (r.shape.name, cells)
            assert r.compiled_ms is None  # --no-hf-compile
    float32, bfloat16 = bench.dtypes
    assert float32.weight_bytes == 2 * bfloat16.weight_bytes
    assert bench.bandwidth_gb_s > 0


def test_the_floor_multiplies_the_tokens_the_step_feeds(result):
    config, bench, _ = result
    by_name = {r.shape.name: r for r in bench.dtypes[0].shapes}
    assert by_name["4 rows x 1"].floor_tokens == 4
    assert by_name["1 row x 5 (draft 4)"].floor_tokens == 5
    assert by_name["1 row x 6 (tree 5)"].floor_tokens == 6
    assert by_name["prefill 40"].floor_tokens == 40


def test_the_floor_feeds_every_weight_the_steps_rows(result):
    config, _, _ = result
    model = copy.deepcopy(tiny_llama(seed=3).model)  # plain modules, as transformers loads
    shapes = {s.name: s for s in config.shapes()}
    inputs = floor_inputs(model, shapes["4 rows x 1"])
    head = model.get_output_embeddings().weight
    layers = model.config.num_hidden_layers
    assert len(inputs) == 7 * layers + 1  # q, k, v, o, gate, up, down per layer, the head
    assert all(x.shape[0] == 4 for x, _, _ in inputs)
    assert sum(w is head for _, w, _ in inputs) == 1
    draft = floor_inputs(model, shapes["1 row x 5 (draft 4)"])
    assert [x.shape[0] for x, _, _ in draft] == [5] * (7 * layers + 1)  # 5 logits kept
    prefill = floor_inputs(model, shapes["prefill 40"])
    assert [x.shape[0] for x, w, _ in prefill] == [1 if w is head else 40 for _, w, _ in prefill]


def test_the_tables_name_every_shape_and_ratio(result, tmp_path):
    config, bench, seen = result
    text = markdown(bench)
    for shape in config.shapes():
        assert text.count(f"| {shape.name} |") == 2  # one row per dtype
    assert "avx512_bf16" in text and "torch threads: 1" in text
    four = next(r for r in bench.dtypes[0].shapes if r.shape.name == "4 rows x 1")
    ratios = four.ratios(bench.dtypes[0].one_row())
    assert ratios["N / 1 row (invariant)"] == pytest.approx(
        four.invariant_ms / bench.dtypes[0].one_row().invariant_ms)
    assert ratios["invariant / compiled"] is None
    json_path, table_path = save(bench, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["dtypes"][0]["shapes"][1]["ratios"]["N / 1 row (invariant)"] > 0
    assert table_path.read_text() == text
    assert seen[-1][1] == seen[-1][2] == 2 * len(config.shapes()) * 5


def test_every_engine_call_feeds_the_shape_after_the_same_context(result, monkeypatch):
    """The engine's rows are set back before each call: every call feeds the shape's tokens
    after exactly ``context`` cached ones (the prefill from position 0, a fresh sequence)."""
    import cascade.core.verify.engine as engine_module
    from cascade.bench.step.rows import EngineRows
    from cascade.core.model.runner import ModelRunner, ModelSpec

    config, _, _ = result
    fed, forward = [], engine_module.packed_forward

    def spy(model, store, feeds, *args, **kwargs):
        fed.append([(f.start, len(f.tokens), f.parents is not None) for f in feeds])
        return forward(model, store, feeds, *args, **kwargs)

    monkeypatch.setattr(engine_module, "packed_forward", spy)
    rows = EngineRows(ModelRunner.load(ModelSpec(str(config.target))), True, config)
    try:
        for shape in config.shapes():
            fed.clear()
            for _ in range(3):
                rows.prepare(shape)()
            start = 0 if shape.prefill else config.context
            tree = shape.parents is not None
            assert fed == [[(start, shape.tokens, tree)] * shape.rows] * 3, shape.name
    finally:
        rows.close()


def test_the_engines_compiled_columns_sit_beside_the_eager_ones(tmp_path):
    folder = tmp_path / "tiny-llama"
    tiny_llama(seed=3).model.save_pretrained(folder)
    build_tokenizer(folder)
    config = EngineBenchConfig(folder, ("float32",), threads=1, repeats=1, context=24,
                               hf_compile=False, rows=(1, 3), drafts=(), tree=(), prefill=0,
                               bandwidth_mib=64)
    (dtype,) = run_engine_bench(config).dtypes
    assert not dtype.column_errors
    one, three = dtype.shapes
    for r in (one, three):
        assert min(r.plain_compiled_ms, r.invariant_compiled_ms, r.invariant_ms) > 0
    ratios = three.ratios(one)
    assert ratios["invariant compiled / invariant"] == pytest.approx(
        three.invariant_compiled_ms / three.invariant_ms)
    assert ratios["N / 1 row (invariant compiled)"] == pytest.approx(
        three.invariant_compiled_ms / one.invariant_compiled_ms)
    assert "| engine plain compiled | engine invariant compiled |" in table(dtype)
