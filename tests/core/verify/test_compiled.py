"""The target's step compiled (``--compile on``): one graph for every step after the warm-up,
logits within rounding of the eager step, the batch-invariant pass still invariant, greedy
speculation still the target's own greedy decoding. One tiny model is compiled for the suite
(about 20 s on two cores); the other attention families are marked slow."""

import pytest
import torch

from cascade.core.verify import compiled
from cascade.core.verify.compiled import compile_target, is_compiled, wanted, warm_up
from cascade.core.verify.engine import Pass, VerifyEngine
from cascade.core.loop import generate
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import hf_greedy, random_prompts, tiny_gemma2, tiny_gpt2, tiny_llama, tiny_mistral
from test_invariant import LENGTH, _chunked, _decoded, _tokens
from verifier_service.scheduler import VerifierSettings


def _compiled_engine(make, dtype=torch.float32):
    """(engine on the compiled target, every position's logits from the eager engine)."""
    runner = make(0)
    runner.model.to(dtype)
    eager = _decoded(VerifyEngine(runner, kv_tokens=16 * LENGTH), _tokens(1))
    assert compile_target(runner, "on") and is_compiled(runner.model)
    engine = VerifyEngine(runner, kv_tokens=16 * LENGTH)
    assert warm_up(engine, lambda line: None) > 0
    return engine, eager


@pytest.fixture(scope="module")
def llama():
    return _compiled_engine(tiny_llama)


def _assert_invariant(engine, eager, tolerance):
    tokens = _tokens(1)
    reference = _decoded(engine, tokens)
    torch.testing.assert_close(reference, eager, atol=tolerance, rtol=tolerance)
    others = [_tokens(seed, length) for seed, length in ((2, 40), (3, LENGTH), (4, 90))]
    for prompt_len, k in ((1, 1), (7, 4), (30, 15)):
        assert torch.equal(_chunked(engine, tokens, prompt_len, k, others), reference)


def test_a_compiled_position_gets_the_same_logits_from_every_pass(llama):
    engine, eager = llama
    _assert_invariant(engine, eager, 1e-4)


def test_after_the_warm_up_no_step_compiles_again(llama):
    engine, _ = llama
    caches = [engine.admit(40) for _ in range(3)]
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            engine.run([Pass(caches[0], _tokens(5, 30), 3)])  # a prefill, three logits kept
            engine.run([Pass(c, _tokens(5 + i, 31), 1) for i, c in enumerate(caches)])
            tree = Pass(caches[0], _tokens(5, 35), 5, parents=(-1, -1, 0, 1))
            engine.run([tree, Pass(caches[1], _tokens(6, 32), 1)])
    finally:
        for cache in caches:
            cache.release()


def test_greedy_speculation_on_a_compiled_target_is_the_targets_greedy(llama):
    engine, _ = llama
    target, drafter = engine.runner, tiny_llama(1, num_layers=1)
    params = SamplingParams(max_new_tokens=24)
    for prompt in random_prompts(3, seed=9, min_len=3, max_len=40):
        out = generate(target, prompt, params, drafter,
                       DraftConfig(num_draft_tokens=4, method="model"))
        assert out.tokens == hf_greedy(target, prompt, 24)


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny_gpt2, tiny_mistral, tiny_gemma2])
def test_other_attention_families_stay_invariant_compiled(make):
    _assert_invariant(*_compiled_engine(make), 1e-4)


@pytest.mark.slow
def test_bfloat16_stays_invariant_compiled():
    _assert_invariant(*_compiled_engine(tiny_llama, torch.bfloat16), 0.05)


def test_auto_compiles_on_a_gpu_only_and_a_bad_mode_is_refused():
    assert [wanted(m, "cpu") for m in compiled.MODES] == [False, False, True]
    assert [wanted(m, "cuda:0") for m in compiled.MODES] == [False, True, True]
    with pytest.raises(ValueError, match="off.*auto.*on"):
        wanted("fast", "cpu")
    with pytest.raises(ValueError, match="compile must be one of"):
        VerifierSettings(compile="fast")


def test_an_uncompiled_target_stays_eager():
    runner = tiny_llama(0)
    assert not compile_target(runner, "auto") and not is_compiled(runner.model)
    assert warm_up(VerifyEngine(runner, kv_tokens=LENGTH)) == 0.0


def test_compiled_kernels_are_kept_per_model_and_dtype():
    runner = tiny_llama(0)
    first = compiled.cache_dir(runner)
    runner.model.to(torch.bfloat16)
    assert compiled.cache_dir(runner) != first
    assert first.parent.name == "compile" and first.name.startswith(runner.model.name_or_path
                                                                     or "unnamed")
