"""``cascade bench engine``'s device options on the CPU: ``--random-weights`` from a config.json,
``--rows`` and ``--drafts`` lists, the device fence and bandwidth helpers (no speed
assertions; the CUDA paths run on a GPU machine through scripts/gpu_bench.sh)."""

import json

import pytest
import torch
from transformers import LlamaConfig
from typer.testing import CliRunner

from cascade.bench.step import engine
from cascade.bench.step.device import copy_bandwidth, device_name, load_models, synchronizer
from cascade.cli.main import app
from cascade.core.model.weights import random_config, random_model


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    """A folder holding only a tiny Llama's config.json."""
    folder = tmp_path_factory.mktemp("tiny-llama-config")
    LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                max_position_embeddings=512, tie_word_embeddings=False).save_pretrained(folder)
    return folder


def test_random_weights_from_a_config_fill_the_rows_asked_for(tiny_config, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "bench", "engine", "--target", str(tiny_config), "--random-weights", "--device", "cpu",
        "--dtype", "float32", "--repeats", "1", "--no-hf-compile", "--no-engine-compile",
        "--threads", "1", "--context", "16", "--rows", "1,2", "--drafts", "1,33", "--no-tree",
        "--prefill", "0", "--bandwidth-mib", "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "engine.json").read_text())
    assert data["device"] == "cpu" and data["gpu"] is None
    (dtype,) = data["dtypes"]
    names = [s["shape"]["name"] for s in dtype["shapes"]]
    assert names == ["1 row x 1", "2 rows x 1", "1 row x 2 (draft 1)", "1 row x 34 (draft 33)"]
    assert dtype["column_errors"] == {}  # a draft past 32 tokens fits the sequences' room
    for shape in dtype["shapes"]:
        cells = [shape[k] for k in ("plain_ms", "invariant_ms", "eager_ms", "floor_ms",
                                    "bandwidth_ms")]
        assert all(c > 0 for c in cells), (shape["shape"]["name"], cells)
    table = (out / "table.md").read_text()
    assert all(f"| {name} |" in table for name in names)


def test_the_cpu_keeps_a_plain_model_beside_the_runners_packed_copy(tiny_config):
    config = engine.EngineBenchConfig(tiny_config, ("float32",), random_weights=True,
                                      engine_compile=False)
    runner, model = load_models(config, "float32")
    assert runner.model is not model
    assert all(type(m) is torch.nn.Linear for m in _linears(model))


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def test_a_random_model_is_built_in_the_dtype_asked_for(tiny_config):
    model = random_model(tiny_config, torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored
    assert not model.training


def test_llama3_8b_is_a_built_in_config():
    config = random_config("llama3-8b")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size, config.vocab_size,
            config.max_position_embeddings, config.tie_word_embeddings) == (
        4096, 32, 32, 8, 14336, 128256, 8192, False)
    assert config.rope_parameters["rope_theta"] == 500000.0


def test_a_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        random_config(tmp_path)


@pytest.mark.parametrize("text, expected", [("1,4,16,32", (1, 4, 16, 32)), ("7", (7,)),
                                            ("1, 3,", (1, 3))])
def test_comma_lists(text, expected):
    assert engine.int_list(text) == expected


def test_the_cpu_needs_no_fence_and_has_no_gpu_name():
    assert synchronizer("cpu")() is None
    assert device_name("cpu") is None
    assert copy_bandwidth("cpu", 8 << 20, tries=2) > 0


def test_cuda_is_refused_where_torch_sees_none(tiny_config):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(ValueError, match="CUDA"):
        engine.EngineBenchConfig(tiny_config, device="cuda")


def test_a_failing_column_stays_empty_and_the_run_goes_on(tiny_config, monkeypatch):
    """(A CUDA path the engine lacks must not cost the other columns' numbers.)"""
    def broken(model, shape):
        raise RuntimeError("Expected all tensors to be on the same device\nmore")

    monkeypatch.setattr(engine, "floor_prepare", broken)
    config = engine.EngineBenchConfig(tiny_config, ("float32",), threads=1, repeats=1,
                                      context=8, hf_compile=False, rows=(1,), drafts=(2,),
                                      tree=(), prefill=0, bandwidth_mib=8, random_weights=True,
                                      engine_compile=False)
    (dtype,) = engine.run_engine_bench(config).dtypes
    assert dtype.column_errors == {
        "floor": "RuntimeError: Expected all tensors to be on the same device"}
    for r in dtype.shapes:
        assert r.floor_ms is None and r.ratios(dtype.one_row())["invariant / floor"] is None
        assert min(r.plain_ms, r.invariant_ms, r.eager_ms) > 0
