"""The step-cost model: a fit recovers the curves it is given (flat or steep per-token cost, a
knee, slow one-token rows), real steps refine it without a lone outlier pulling it, it survives
JSON and is cached per dtype; the profile runs on a tiny model within its budget and times a
disturbed pass again; the CLI prints its table and writes its plot."""

import time

import pytest
import torch
from typer.testing import CliRunner

from cascade.cli.models import models_app
from cascade.core.verify import step_profile
from cascade.core.model.runner import ModelRunner
from cascade.core.verify.step_cost import StepCostError, StepCostModel, StepShape
from cascade.core.verify.step_profile import ProfileGrid, cache_path, load_or_profile, profile
from models import tiny_gpt2_folder, tiny_llama

BASE_S = 0.010
TERMS = {"row": 2e-4, "kv": 1e-6, "attention": 1e-8, "decode": 3e-6}
SMALL_GRID = ProfileGrid(rows=(1, 4), tokens=(1, 3, 9, 33, 65), cached=(8, 64), dense_tokens=0)


def synthetic(per_token: float, knee: int = 1):
    """A pass time: BASE_S, then per_token one-token passes per token past ``knee``, plus the
    linear terms."""
    def seconds(s: StepShape) -> float:
        return (BASE_S * (1 + per_token * max(0, s.num_tokens - knee))
                + TERMS["row"] * (s.num_rows - 1) + TERMS["kv"] * s.num_cached
                + TERMS["attention"] * s.num_tokens * s.num_cached / s.num_rows
                + TERMS["decode"] * s.num_decode_cached)
    return seconds


def fitted(truth, **kwargs) -> StepCostModel:
    shapes = [StepShape(r, r * t, r * c) for r, t, c in ProfileGrid().shapes()]
    return StepCostModel.fit([(s, truth(s)) for s in shapes], **kwargs)


@pytest.mark.parametrize("per_token, knee, ratio_9_to_1", [
    (0.01, 1, 1.08),   # flat: wide passes nearly free (GPU, AMX in bfloat16)
    (0.125, 1, 2.0),   # steep: a 9-token pass costs two one-token passes
    (0.1, 16, 1.0),    # flat up to a knee at 16 tokens, then linear
])
def test_a_fit_recovers_the_per_token_cost(per_token, knee, ratio_9_to_1):
    truth = synthetic(per_token, knee)
    model = fitted(truth)
    one, nine = StepShape(1, 1, 16), StepShape(1, 9, 16)
    assert model.predict(nine) / model.predict(one) == pytest.approx(ratio_9_to_1, rel=0.01)
    for shape in (StepShape(3, 40, 900), StepShape(6, 13, 60), StepShape(2, 600, 100)):
        assert model.predict(shape) == pytest.approx(truth(shape), rel=0.01)
    assert model.terms == pytest.approx(TERMS, rel=0.01)
    decoding, one_draft = StepShape(8, 8, 8 * 500), StepShape(8, 16, 8 * 500)
    assert model.predict(decoding) == pytest.approx(truth(decoding), rel=0.01)
    assert model.predict(one_draft) == pytest.approx(truth(one_draft), rel=0.01)
    for shape, bigger in ((StepShape(4, 20, 400), StepShape(4, 24, 400)),
                          (StepShape(3, 5, 300, 100), StepShape(3, 7, 300, 100)),
                          (StepShape(8, 8, 800), StepShape(8, 16, 800, 0))):
        assert model.marginal(shape, bigger.num_tokens - shape.num_tokens) == pytest.approx(
            truth(bigger) - truth(shape), rel=0.02)


def test_a_point_the_fit_disagrees_with_is_named():
    truth = synthetic(0.125)
    shapes = [StepShape(r, r * t, r * c) for r, t, c in ProfileGrid().shapes()]
    disturbed = shapes.index(StepShape(16, 48, 16 * 512))
    model = StepCostModel.fit([(s, truth(s) * (3 if i == disturbed else 1))
                               for i, s in enumerate(shapes)])
    assert model.disagreeing() == [disturbed]


def test_profile_times_a_disturbed_point_again(monkeypatch):
    """Every round of one pass is slowed (another process had the cores); the profile times
    it again afterwards and fits the new timing."""
    real_time, slowed = step_profile._time, {"on": True}

    def time_pass(engine, passes):
        seconds = real_time(engine, passes)
        is_target = len(passes) == 4 and len(passes[0].tokens) == 64 + 9
        return seconds + 0.05 if slowed["on"] and is_target else seconds

    def measure(*args):
        points = real_measure(*args)
        slowed["on"] = False
        return points

    real_measure = step_profile._measure
    monkeypatch.setattr(step_profile, "_time", time_pass)
    monkeypatch.setattr(step_profile, "_measure", measure)
    model = profile(tiny_llama(0), seconds=2.0, grid=SMALL_GRID)
    target = StepShape(4, 36, 4 * 64)
    assert dict(model.retimed)[target] > 0.05
    assert dict(model.points)[target] < 0.05


def test_linear_terms_stay_non_negative():
    truth = synthetic(0.05)
    model = fitted(lambda s: truth(s) - 1.5 * TERMS["row"] * (s.num_rows - 1))
    assert model.terms["row"] == 0.0
    assert all(model.predict(StepShape(r, r, 0)) > 0 for r in (1, 8, 16))


def test_observe_follows_a_lasting_change_and_shrugs_off_a_lone_outlier():
    truth = synthetic(0.05)
    shape = StepShape(4, 12, 400)
    model = fitted(truth, refit_every=1)
    for _ in range(20):
        model.observe(shape, truth(shape))
    before = model.predict(shape)
    model.observe(shape, 10 * before)  # a GC pause
    assert model.predict(shape) == pytest.approx(before, rel=0.01)
    for _ in range(60):
        model.observe(shape, 1.5 * truth(shape))  # the machine got slower
    assert model.predict(shape) > 1.35 * truth(shape)
    far = StepShape(1, 1, 16)  # a shape real traffic never hit keeps its profiled cost
    assert model.predict(far) == pytest.approx(truth(far), rel=0.1)


def test_observe_past_the_profile_adds_a_knot_without_moving_predictions():
    truth = synthetic(0.05)
    model = fitted(truth, refit_every=1)
    prefill = StepShape(1, 1500)
    before = model.predict(prefill)
    model.observe(prefill, before)
    assert model.knots[-1] == 2048
    assert model.predict(prefill) == pytest.approx(before, rel=1e-6)
    for _ in range(30):
        model.observe(prefill, 2 * before)
    assert model.predict(prefill) > 1.7 * before


def test_json_round_trip():
    model = fitted(synthetic(0.125), meta={"dtype": "float32"})
    again = StepCostModel.from_json(model.to_json())
    assert again.meta == {"dtype": "float32"} and again.knots == model.knots
    for shape in (StepShape(1, 1), StepShape(5, 17, 300, 100), StepShape(16, 500, 9000)):
        assert again.predict(shape) == model.predict(shape)


@pytest.mark.parametrize("text", ["not json", "{}", '{"version": 99}',
                                  '{"version": 2, "knots": [1], "coef": [1.0], "points": []}'])
def test_a_damaged_file_is_a_typed_error(text):
    with pytest.raises(StepCostError):
        StepCostModel.from_json(text)


@pytest.mark.parametrize("fields", [(0, 1, 0), (2, 1, 0), (1, 1, -1), (2, 3, 10, 11)])
def test_a_bad_shape_names_its_field(fields):
    with pytest.raises(ValueError, match="num_"):
        StepShape(*fields)


def test_the_cache_key_changes_with_the_dtype(tmp_path):
    runner = tiny_llama(0)
    assert cache_path(runner, tmp_path) == cache_path(tiny_llama(0), tmp_path)
    half = ModelRunner(tiny_llama(0).model.to(torch.bfloat16))
    assert cache_path(half, tmp_path) != cache_path(runner, tmp_path)


def test_the_cache_key_changes_with_the_tensor_parallel_ranks(tmp_path):
    """A split target's passes wait for its other ranks: its profile is its own."""
    from cascade.core.model.tensor_parallel import Shard

    runner, split = tiny_llama(0), tiny_llama(0)
    split.model.cascade_shard = Shard(0, 2)
    assert cache_path(split, tmp_path) != cache_path(runner, tmp_path)


def test_load_or_profile_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    runner = tiny_llama(0)
    first = load_or_profile(runner, tmp_path, seconds=0.3, grid=SMALL_GRID)
    assert cache_path(runner, tmp_path).exists()
    monkeypatch.setattr("cascade.core.verify.step_profile.profile", pytest.fail)
    again = load_or_profile(runner, tmp_path)
    assert again.coef == first.coef and again.meta["dtype"] == "float32"


def test_profile_on_a_tiny_model_within_its_budget():
    runner = tiny_llama(0, width=128)
    started = time.perf_counter()
    model = profile(runner, seconds=1.0, grid=SMALL_GRID)
    assert time.perf_counter() - started < 3.0
    assert len(model.points) >= 6
    assert all(model.predict(s) > 0 for s, _ in model.points)
    sizes = [model.predict(StepShape(1, n)) for n in (256, 1024, 4096)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_the_profile_command_prints_the_table_and_writes_the_plot(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tiny_gpt2_folder(tmp_path / "model")
    plot = tmp_path / "step_cost.png"
    result = CliRunner().invoke(models_app, ["profile", "--target", str(folder), "--seconds",
                                             "4", "--plot", str(plot), "--threads", "2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # as printed, wrapped at the terminal's width
    assert "9-token pass costs" in text and "flags" in text, result.output
    assert plot.stat().st_size > 0
    assert list((tmp_path / "cache" / "cascade" / "step-cost").glob("model-*.json"))
