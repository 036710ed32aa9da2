"""A target split over two ranks (gloo, two processes on this CPU) computes what the whole
target computes: the engine's passes (chains, trees, a prefix taken from another sequence,
hidden states), greedy speculation token for token, sampling by the target's distribution; the
invariant pass stays batch-invariant; a model that does not divide is refused up front."""

import copy
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from cascade.core.parallel import rank_processes
from cascade.core.verify.engine import Pass, VerifyEngine
from cascade.core.loop import generate
from cascade.core.model.runner import ModelSpec
from cascade.core.model.tensor_parallel import TensorParallelError, check
from cascade.core.model.weights import check_split
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import full_forward, hf_greedy, tiny_gpt2, tiny_llama, tiny_mistral
from tokenizers_fixture import build_tokenizer

BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "mistral": tiny_mistral}
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4], [3, 3, 3, 8, 9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]]


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def split(request, tmp_path_factory):
    """(the whole target, the same target split over two ranks)."""
    whole = BUILDERS[request.param](seed=7)
    folder = tmp_path_factory.mktemp(request.param)
    copy.deepcopy(whole.model).save_pretrained(folder)  # a copy: packed weights do not save
    build_tokenizer(folder)
    sharded = rank_processes.load_sharded(ModelSpec(str(folder)), world=2, threads=1)
    yield whole, sharded
    rank_processes.stop_ranks(sharded)


def _passes(engine: VerifyEngine, hidden: bool = False) -> list:
    """Three steps: prompts in one pass, a chain on each, a token tree on the first."""
    layers = (1, -1) if hidden else ()
    caches = [engine.admit(128) for _ in PROMPTS]
    steps = [[Pass(c, p, 3, layers) for c, p in zip(caches, PROMPTS)],
             [Pass(c, p + [5, 6], 2, layers) for c, p in zip(caches, PROMPTS)],
             [Pass(caches[0], PROMPTS[0] + [5, 6, 9, 10, 11], 4, parents=(-1, 0, 0))]]
    return [o for step in steps for o in engine.run(step)]


def test_split_passes_match_the_whole_model(split):
    whole, sharded = split
    for a, b in zip(_passes(VerifyEngine(whole, invariant=False), hidden=True),
                    _passes(VerifyEngine(sharded, invariant=False), hidden=True)):
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(b.logits.argmax(-1), a.logits.argmax(-1))
        for x, y in zip(a.hidden_states, b.hidden_states):
            torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)


def test_a_taken_prefix_and_prompt_logprobs_match_the_whole_model(split):
    """A second sequence takes the first's 150-token prefix (two blocks held, the third's
    22 positions copied: a block copy every rank makes) and scores its prompt."""
    whole, sharded = split
    first = [(7 * i + 3) % 90 + 1 for i in range(150)]
    second = first + [5, 9, 11, 2]
    outputs = []
    for runner in (whole, sharded):
        engine = VerifyEngine(runner, invariant=False)
        held = engine.admit(256)  # live while the second takes its prefix
        engine.run([Pass(held, first, 1)])
        outputs.append(engine.run([Pass(engine.admit(256), second, 2, num_leading=3,
                                        leading_top=2)])[0])
        assert engine.prefixes.shared_tokens == 149  # 2 blocks held, 21 positions copied
    (a, b) = outputs
    torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
    assert [t.top_ids for t in b.leading] == [t.top_ids for t in a.leading]
    for x, y in zip(a.leading, b.leading):
        assert abs(x.logprob - y.logprob) < 1e-4


def test_a_pass_that_fails_on_every_rank_leaves_the_ranks_in_step(split):
    """A token outside the vocabulary fails the pass on rank 0 and on the follower alike;
    the next pass runs on both and is right."""
    whole, sharded = split
    engine = VerifyEngine(sharded, invariant=False)
    with pytest.raises(IndexError):
        engine.run([Pass(engine.admit(64), [1, 2, 10_000], 1)])
    logits = engine.run([Pass(engine.admit(64), PROMPTS[1], 1)])[0].logits
    reference = full_forward(whole.model, PROMPTS[1]).logits[0, -1:]
    torch.testing.assert_close(logits, reference.float(), atol=1e-4, rtol=1e-4)


def test_the_invariant_pass_keeps_a_rows_logits_whatever_shares_the_pass(split):
    _, sharded = split
    engine = VerifyEngine(sharded, invariant=True)
    alone = engine.run([Pass(engine.admit(64), PROMPTS[2], 4)])[0].logits
    caches = [engine.admit(64) for _ in PROMPTS]
    crowded = engine.run([Pass(c, p, 4) for c, p in zip(caches, PROMPTS)])[2].logits
    assert torch.equal(alone, crowded)


@pytest.mark.parametrize("config", [DraftConfig(1), DraftConfig(4),
                                    DraftConfig(4, tree_nodes=6)], ids=["k1", "k4", "tree"])
def test_greedy_speculation_is_the_whole_targets_greedy(split, config):
    whole, sharded = split
    drafter = BUILDERS["llama"](seed=99) if whole.model.config.model_type != "gpt2" \
        else BUILDERS["gpt2"](seed=99)
    for prompt in PROMPTS[:2]:
        params = SamplingParams(max_new_tokens=16, temperature=0.0)
        result = generate(sharded, prompt, params, drafter, config)
        assert result.tokens == hf_greedy(whole, prompt, 16)
        assert result.stats.num_draft_tokens > 0


def test_sampling_keeps_the_targets_distribution(split):
    """The first token of 600 seeded speculative generations (a model drafter: q is sent; the
    first token drafted, then accepted or replaced) against the whole target's p, chi-square over
    its likeliest tokens."""
    whole, sharded = split
    if whole.model.config.model_type != "llama":
        pytest.skip("one architecture is enough for the statistics")
    prompt = PROMPTS[1]
    p = torch.softmax(full_forward(whole.model, prompt).logits[0, -1].double(), -1)
    top = torch.argsort(p, descending=True)[:8].tolist()
    runs, counts, drafted = 600, Counter(), 0
    drafter = BUILDERS["llama"](seed=99)
    for seed in range(runs):
        params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed)
        result = generate(sharded, prompt, params, drafter, DraftConfig(2))
        counts[result.tokens[0]] += 1
        drafted += result.stats.num_draft_tokens
    assert drafted >= runs
    observed = [counts[t] for t in top] + [runs - sum(counts[t] for t in top)]
    expected = [runs * float(p[t]) for t in top] + [runs * float(1 - p[top].sum())]
    assert chisquare(observed, expected).pvalue > 1e-3


def test_a_model_that_does_not_divide_is_refused_with_the_reason(tmp_path):
    llama = tiny_llama(seed=1).model  # 4 attention heads, 2 key/value heads
    check(llama, 2)
    with pytest.raises(TensorParallelError, match="4 attention heads and 2 key/value heads: "
                       "--tensor-parallel 4 must divide both"):
        check(llama, 4)
    copy.deepcopy(llama).save_pretrained(tmp_path)
    with pytest.raises(TensorParallelError, match="--tensor-parallel 3"):
        check_split(str(tmp_path), 3)


def test_a_plan_that_gathers_whole_activations_is_refused():
    from models import tiny_phi3_longrope

    with pytest.raises(TensorParallelError, match="colwise_gather_output.*: the verifier "
                       "splits only colwise and rowwise linear layers"):
        check(tiny_phi3_longrope(seed=1).model, 2)
