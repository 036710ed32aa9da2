"""The cascades evaluation: classic cascade limits, the quality scores, and the rules' limits
(alpha 0 with Chow is lossless; alpha 1 keeps every drafted token)."""

from __future__ import annotations

import torch

from cascade.bench.drafting.cascades_eval import Method, classic_cascade, quality, run_method
from cascade.bench.prompts import BenchPrompt
from cascade.protocol.settings import SamplingParams
from models import hf_greedy, random_prompts

PARAMS = SamplingParams(temperature=0.0, max_new_tokens=12)


def prompts() -> list[BenchPrompt]:
    return [BenchPrompt("prose", "", False, tuple(p)) for p in random_prompts(3, seed=11)]


def test_classic_cascade_limits(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=5)[0]
    never, passes = classic_cascade(target, drafter, prompt, PARAMS, threshold=0.0)
    assert never == hf_greedy(drafter, prompt, 12) and passes == 0
    always, passes = classic_cascade(target, drafter, prompt, PARAMS, threshold=1.01)
    assert always == hf_greedy(target, prompt, 12) and passes == 12


def test_quality_of_the_targets_own_greedy_output(gpt2_pair):
    target, drafter = gpt2_pair
    prompt = random_prompts(1, seed=6)[0]
    output = hf_greedy(target, prompt, 10)
    log_likelihood, agree = quality(target, prompt, output)
    assert agree == 10
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None]).sum()
    assert abs(log_likelihood - float(expected)) < 1e-3
    drafted = hf_greedy(drafter, prompt, 10)
    assert quality(target, prompt, drafted)[1] < 10  # the drafter disagrees somewhere


def test_rule_limits_and_costs(gpt2_pair):
    target, drafter = gpt2_pair
    lossless = run_method(Method("lossless", 0.0), target, drafter, prompts(), PARAMS, k=4)
    chow_zero = run_method(Method("chow", 0.0), target, drafter, prompts(), PARAMS, k=4)
    chow_one = run_method(Method("chow", 1.0), target, drafter, prompts(), PARAMS, k=4)
    assert chow_zero.outputs == lossless.outputs
    assert lossless.target_argmax == lossless.tokens == 36
    # every drafted token kept: rounds of k + 1 tokens (4 drafted and the target's bonus), so
    # 12 tokens take 3 passes (5 + 5 + 2) per prompt
    assert chow_one.target_passes == 9 < lossless.target_passes
    row = chow_one.row()
    assert row["passes_per_token"] == round(chow_one.target_passes / 36, 4)
    assert row["target_argmax_fraction"] < 1.0


def test_the_services_emit_the_in_process_tokens(tmp_path):
    """Through a real local cluster (processes, gRPC, Redis) a cascade rule and lossless
    decoding give the tokens of the in-process loop, and the table shows both speeds."""
    from cascade.bench.drafting.cascades_eval import add_services, rows_markdown
    from cascade.bench.drafting.cascades_services import run_on_services
    from cascade.bench.prompts import bench_prompts
    from cascade.core.model.runner import ModelRunner, ModelSpec
    from cascade.tools.tiny_models import build_tiny_pair

    target_dir, drafter_dir = build_tiny_pair(tmp_path / "models")
    target, drafter = (ModelRunner.load(ModelSpec(str(d))) for d in (target_dir, drafter_dir))
    prompts = bench_prompts(target.tokenizer, 1, ["prose"])
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(temperature=0.0, max_new_tokens=8,
                            stop_token_ids=() if eos is None else (eos,))
    chosen = [Method("lossless", 0.0), Method("token_v2", 0.5)]
    scores = [run_method(m, target, drafter, prompts, params, k=3) for m in chosen]
    runs = run_on_services(target_dir, drafter_dir, prompts, 3, 8, chosen, tmp_path / "run")
    rows = [score.row() for score in scores]
    add_services(rows, scores, runs)
    assert all(row["services_same_tokens"] for row in rows), rows
    assert all(row["services_tokens_per_s"] > 0 for row in rows)
    assert "| token_v2 | 0.5 |" in rows_markdown(rows)
