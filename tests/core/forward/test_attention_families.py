"""Attention families beyond plain causal attention, through the packed pass: sliding windows
(Mistral, Qwen2, Gemma-2, Gemma-3), soft-capped attention logits (Gemma-2) and rotary
frequencies that depend on the sequence length (LongRoPE, dynamic NTK). Greedy decoding equals
transformers' own, token for token, on prompts longer than the window; a row's logits do not
depend on the rows batched with it; models whose attention the pass does not implement are
refused when the engine is built. (Phi-3-small needs code from the model hub: not covered.)"""

import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM, Llama4ForCausalLM, Llama4TextConfig

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.kv.kv_store import KVShape, KVStore
from cascade.core.loop import generate, speculative_rounds
from cascade.core.forward.packed import Feed, packed_forward
from cascade.core.forward.packed_backend import UnsupportedModel, enable
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import (
    VOCAB_SIZE,
    full_forward,
    hf_greedy,
    random_prompts,
    tiny_gemma2,
    tiny_gemma3,
    tiny_llama,
    tiny_llama_dynamic,
    tiny_mistral,
    tiny_phi3_longrope,
    tiny_qwen2_sliding,
)

NUM_NEW = 12
FAMILIES = {
    "mistral": tiny_mistral,
    "qwen2": tiny_qwen2_sliding,
    "gemma2": tiny_gemma2,
    "gemma3": tiny_gemma3,
    "phi3_longrope": tiny_phi3_longrope,
}
WINDOWED_PROMPTS = random_prompts(2, seed=11, min_len=14, max_len=22)
LONGROPE_PROMPTS = random_prompts(1, seed=12, min_len=6, max_len=8) + \
    random_prompts(1, seed=13, min_len=40, max_len=44)
"""One sequence stays below LongRoPE's 32 original positions for its whole life, one starts
above them (across the switch, block verification and one-token decoding disagree by design)."""


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(target, prompts, transformers' greedy continuation of each prompt)."""
    target = FAMILIES[request.param](seed=5)
    prompts = LONGROPE_PROMPTS if request.param == "phi3_longrope" else WINDOWED_PROMPTS
    return target, prompts, [hf_greedy(target, p, NUM_NEW) for p in prompts]


@pytest.fixture(scope="module")
def small_drafter():
    return tiny_llama(seed=6, num_layers=1, width=32)


def test_target_alone_equals_transformers_greedy(family):
    """Also after the engine switched the model to packed attention, its own ``generate`` (the
    implementation's path without a packed step) is unchanged."""
    target, prompts, references = family
    params = SamplingParams(max_new_tokens=NUM_NEW)
    for prompt, expected in zip(prompts, references):
        assert generate(target, prompt, params, drafter=None).tokens == expected
        assert hf_greedy(target, prompt, NUM_NEW) == expected


@pytest.mark.parametrize("k", [2, 5])
def test_speculative_greedy_equals_transformers_greedy(family, small_drafter, k):
    target, prompts, references = family
    params = SamplingParams(max_new_tokens=NUM_NEW)
    for drafter in (small_drafter, target):
        for prompt, expected in zip(prompts, references):
            result = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=k))
            assert result.tokens == expected


def test_batched_sequences_get_what_they_get_alone(family, small_drafter):
    """Every session's rounds through one shared step equal its rounds alone."""
    target, prompts, _ = family
    params, config = SamplingParams(max_new_tokens=NUM_NEW), DraftConfig(num_draft_tokens=3)
    alone = [[(d, o) for d, o, _ in speculative_rounds(target, p, params, small_drafter,
                                                       config)] for p in prompts]
    engine = VerifyEngine(target, kv_tokens=512)
    sequences = [SequenceVerifier(target, p, params, engine=engine) for p in prompts]
    for number in range(max(len(rounds) for rounds in alone)):
        live = [i for i, rounds in enumerate(alone) if number < len(rounds)]
        results = engine.step([(sequences[i], alone[i][number][0]) for i in live])
        for i, result in zip(live, results):
            assert result == alone[i][number][1], f"sequence {i}, round {number}"


def _packed_logits(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """Every position's logits of each row, all rows fed in one packed pass from empty."""
    enable(model)
    store = KVStore(KVShape.of(model), 256, model.device)
    feeds = [Feed(store.new_table(len(row)), 0, row) for row in rows]
    total = sum(len(row) for row in rows)
    logits, _ = packed_forward(model, store, feeds, torch.arange(total))
    return list(logits.split([len(row) for row in rows]))


@pytest.mark.parametrize("make", [tiny_phi3_longrope, tiny_llama_dynamic])
def test_length_dependent_rope_is_per_row(make):
    """A short row batched with a row past the original context keeps its own frequencies;
    each row equals transformers' forward over that row by itself."""
    model = make(seed=7).model
    short, long = random_prompts(1, seed=8, min_len=10, max_len=10)[0], \
        random_prompts(1, seed=9, min_len=40, max_len=40)[0]
    alone = _packed_logits(model, [short])[0]
    batched = _packed_logits(model, [short, long])
    torch.testing.assert_close(batched[0], alone, atol=1e-4, rtol=1e-4)
    for row, logits in zip((short, long), batched):
        expected = full_forward(model, row).logits[0]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_packed_window_matches_transformers_forward_for_every_row():
    """Rows of different lengths, fed from empty: each equals the model's own forward."""
    model = tiny_gemma2(seed=3).model
    rows = random_prompts(3, seed=10, min_len=2, max_len=20)
    for row, logits in zip(rows, _packed_logits(model, rows)):
        torch.testing.assert_close(logits, full_forward(model, row).logits[0],
                                   atol=1e-4, rtol=1e-4)


def _gpt_oss():
    torch.manual_seed(0)
    return GptOssForCausalLM(GptOssConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=4))


def _llama4_chunked():
    torch.manual_seed(0)
    return Llama4ForCausalLM(Llama4TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=32,
        intermediate_size_mlp=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=1, attention_chunk_size=8))


@pytest.mark.parametrize("build, model_type, reason", [
    (_gpt_oss, "gpt_oss", "sinks"),
    (_llama4_chunked, "llama4_text", "chunked"),
])
def test_unsupported_attention_is_refused_when_the_engine_is_built(build, model_type, reason):
    from cascade.core.model.runner import ModelRunner

    with pytest.raises(UnsupportedModel, match=f"{model_type}.*{reason}"):
        VerifyEngine(ModelRunner(build()), kv_tokens=64)


@pytest.mark.parametrize("make_drafter", ["tiny_mistral", "tiny_gemma2"])
def test_a_sliding_window_drafter_rolls_back_and_stays_exact(make_drafter):
    """A drafter whose layers slide must roll its cache back after a rejection (a windowed
    cache cannot, once past its window): the output is still the target's greedy one."""
    import models

    target = models.tiny_llama(3)
    drafter = getattr(models, make_drafter)(4)
    params = SamplingParams(max_new_tokens=NUM_NEW)
    for prompt in models.random_prompts(2, seed=9, min_len=14, max_len=22):
        result = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=4))
        assert result.tokens == models.hf_greedy(target, prompt, NUM_NEW)


def test_a_session_resumed_past_the_longrope_switch_goes_on_as_one_token_decoding():
    """A session moved after its text crossed LongRoPE's switch: the prompt was fed in the
    short regime, the tokens after it one by one; the new verifier feeds the context up to
    the switch in a row of its own (short), the rest after it, and goes on as before."""
    target = tiny_phi3_longrope(seed=5)
    prompt = random_prompts(1, seed=14, min_len=20, max_len=20)[0]
    whole = generate(target, prompt, SamplingParams(max_new_tokens=30), drafter=None).tokens
    resumed = SequenceVerifier(target, prompt + whole[:20], SamplingParams(max_new_tokens=30),
                               prompt_len=len(prompt), engine=VerifyEngine(target, 512))
    rest = []
    while not resumed.is_finished:
        rest += resumed.verify(Draft([])).tokens
    assert rest == whole[20:]


def test_longrope_sequences_share_no_prefix():
    """A position's keys depend on the length of the pass that fed it: a prefix held by a
    sequence past the switch is not the one a shorter sequence would compute."""
    target = tiny_phi3_longrope(seed=5)
    engine = VerifyEngine(target, kv_tokens=512)
    prompt = random_prompts(1, seed=15, min_len=40, max_len=40)[0]
    long = SequenceVerifier(target, prompt, SamplingParams(max_new_tokens=4), engine=engine)
    long.verify(Draft([]))
    short = SequenceVerifier(target, prompt[:20], SamplingParams(max_new_tokens=4),
                             engine=engine)
    assert short.verify(Draft([])).tokens == hf_greedy(target, prompt[:20], 1)
    assert engine.prefixes.shared_tokens == 0
    drafter_cache = tiny_phi3_longrope(seed=5)
    drafter_cache.new_cache().forward_to(prompt)
    drafter_cache.new_cache().forward_to(prompt[:20])
    assert drafter_cache.shared_tokens == 0


def test_a_trees_rope_length_is_its_deepest_nodes():
    """A tree whose last-listed node is shallow: its row's frequencies come from its deepest
    position, as a chain through that node gets them (past LongRoPE's switch here)."""
    target = tiny_phi3_longrope(seed=5)
    context = random_prompts(1, seed=16, min_len=30, max_len=30)[0]
    params = SamplingParams(max_new_tokens=8)
    chain = SequenceVerifier(target, context, params, engine=VerifyEngine(target, 512))
    chain.verify(Draft([7, 8, 9]))
    tree = SequenceVerifier(target, context, params, engine=VerifyEngine(target, 512))
    tree.verify(Draft([7, 8, 9, 11], parents=[-1, 0, 1, -1]))
    torch.testing.assert_close(tree.last_forward.logits[:4], chain.last_forward.logits,
                               atol=1e-4, rtol=1e-4)
