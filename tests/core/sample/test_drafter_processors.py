"""The drafter's q shaped by the request's processors, as the verifier shapes p.

- The q of every drafted position is the verifier-side function (``processors.processed``)
  applied to the drafter's own logits with the same history (one definition for both sides),
  with the penalties, bad_words, min_tokens, logit_bias, and with a grammar.
- Shaping pays: with a strong negative logit_bias or a bad word on tokens the unshaped drafter
  proposes, more drafted tokens are accepted.
- Greedy output with the penalties on equals a slow per-token reference through chains.
"""

import copy
from collections import Counter

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.sample.grammar import GrammarMatcher
from cascade.core.loop import generate
from cascade.core.sample.processors import banned_tokens, penalize, processed
from cascade.core.proposers import ProposerContext
from cascade.core.proposers.model import ModelProposer
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.sample.sampling import process_logits, sparse_to_dense
from cascade.protocol.grammar import Grammar
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.tools.tiny_models import build_tiny_pair
from grammar_reference import SCHEMAS
from models import VOCAB_SIZE, full_forward, penalized, random_prompts

PENALTIES = dict(presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def grammar_pair(tmp_path_factory):
    """The tiny pair with a real tokenizer (a grammar needs one)."""
    target_dir, drafter_dir = build_tiny_pair(tmp_path_factory.mktemp("models"))
    return (ModelRunner.load(ModelSpec(str(target_dir))),
            ModelRunner.load(ModelSpec(str(drafter_dir))))


def _raw_rows(runner: ModelRunner, committed: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens) + 1, vocab] the runner's logits after committed + tokens[:i] (a plain
    full forward pass: no cache)."""
    with torch.no_grad():
        logits = full_forward(runner.model, committed + tokens).logits[0].float()
    return logits[len(committed) - 1:]


def _check_q(runner, params, committed, prompt_len, grammar=None) -> Draft:
    config = DraftConfig(num_draft_tokens=5, max_proposal_tokens=64)
    proposer = ModelProposer(ProposerContext(runner, params, config, prompt_len=prompt_len))
    draft = proposer.propose(committed, 5)
    assert draft.num_tokens >= 5 and draft.has_proposal
    raw = _raw_rows(runner, committed, draft.tokens)
    matcher = None if grammar is None else GrammarMatcher(
        grammar, runner.tokenizer, runner.vocab_size, committed[prompt_len:])
    shaped = processed(raw, Draft(draft.tokens), params, committed, prompt_len, matcher)
    expected = process_logits(shaped[:-1], params)  # [k, vocab]
    got = sparse_to_dense(draft.q_ids, draft.q_probs, runner.vocab_size)
    torch.testing.assert_close(got.double(), expected.double(), atol=2e-5, rtol=1e-4)
    return draft


def test_q_is_the_verifiers_processed_distribution(llama_pair):
    """Every processor at once, the drafter's earlier drafts counted: a bad word and a
    repeated token bite inside the block, min_tokens forbids the stop token throughout."""
    _, drafter = llama_pair
    prompt = random_prompts(1, seed=8)[0]
    committed = prompt + [5, 9, 5]
    params = SamplingParams(temperature=0.9, top_k=20, seed=4, max_new_tokens=40,
                            logit_bias=((7, 4.0), (11, -3.0)), bad_words=((9, 5), (13,)),
                            stop_token_ids=(2,), min_tokens=20, **PENALTIES)
    draft = _check_q(drafter, params, committed, len(prompt))
    q = sparse_to_dense(draft.q_ids, draft.q_probs, drafter.vocab_size)
    assert bool((q[:, 2] == 0).all()) and bool((q[:, 13] == 0).all())


def test_q_under_a_grammar_is_the_verifiers_processed_distribution(grammar_pair):
    """With a JSON schema and penalties: masked rows, forced positions (a point mass the
    drafter fills without its model) and free ones alike."""
    _, drafter = grammar_pair
    grammar = Grammar.json_schema(SCHEMAS["flat"])
    prompt = drafter.tokenizer("def main():").input_ids
    committed = prompt + drafter.tokenizer('{"ok":', add_special_tokens=False).input_ids
    params = SamplingParams(temperature=1.0, seed=2, max_new_tokens=40, grammar=grammar,
                            **PENALTIES)
    draft = _check_q(drafter, params, committed, len(prompt), grammar)
    assert any(float(p.max()) == 1.0 for p in draft.q_probs)  # some position was forced


def _acceptance(target, drafter, params_list, monkeypatch, shaped: bool) -> float:
    """Accepted / drafted tokens over the runs (k = 4, q covering the whole vocabulary)."""
    import cascade.core.proposers.model as model_proposer

    if not shaped:
        monkeypatch.setattr(model_proposer, "_shaper", lambda context: None)
    drafted = accepted = 0
    config = DraftConfig(4, max_proposal_tokens=VOCAB_SIZE)
    for prompt, params in params_list:
        stats = generate(target, prompt, params, drafter, config).stats
        drafted, accepted = drafted + stats.num_draft_tokens, accepted + stats.num_accepted_tokens
    monkeypatch.undo()
    return accepted / drafted


def _favourites(runner, prompts, count: int) -> list[int]:
    """The tokens ``runner`` chooses most often greedily after ``prompts``."""
    chosen = Counter()
    for prompt in prompts:
        chosen.update(generate(runner, prompt, SamplingParams(max_new_tokens=16)).tokens)
    return [token for token, _ in chosen.most_common(count)]


SHAPES = {
    "bias -100, greedy": (0.0, lambda banned: {"logit_bias": tuple((t, -100.0) for t in banned)}),
    "bad words, greedy": (0.0, lambda banned: {"bad_words": tuple((t,) for t in banned)}),
    "bias +5 on a rare token, sampled": (1.0, lambda banned: {"logit_bias": ((1, 5.0),)}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shaping_q_raises_acceptance(llama_pair, monkeypatch, shape):
    """A drafter that agrees with the target (a copy of it) proposes from the target's raw
    distribution. Banning the tokens it proposes most (bias -100, or one-token bad words), or
    lifting one it rarely proposes, leaves its unshaped drafts rejected where the processors
    moved p; its shaped drafts are accepted (q = p)."""
    target, _ = llama_pair
    drafter = ModelRunner(copy.deepcopy(target.model))
    prompts = random_prompts(4, seed=12)
    temperature, fields = SHAPES[shape]
    banned = _favourites(drafter, prompts, 4)
    assert 1 not in banned
    params = [(p, SamplingParams(temperature=temperature, seed=i, max_new_tokens=24,
                                 **fields(banned)))
              for i, p in enumerate(prompts)]
    shaped = _acceptance(target, drafter, params, monkeypatch, shaped=True)
    unshaped = _acceptance(target, drafter, params, monkeypatch, shaped=False)
    print(f"{shape}: acceptance shaped {shaped:.3f}, unshaped {unshaped:.3f}")
    assert shaped > unshaped + 0.1, (shaped, unshaped)
    assert shaped > 0.95


def _penalized_greedy(target, prompt: list[int], num_new: int, bias, bad_words) -> list[int]:
    """The slow reference: one full forward pass per token, the bias, the penalties over
    the tokens before it and the bad words applied to its last logits, then the argmax."""
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(num_new):
            logits = full_forward(target.model, prompt + generated).logits[0, -1]
            for token, value in bias:
                logits[token] += value
            logits = penalized(logits, prompt, generated, PENALTIES["presence_penalty"],
                               PENALTIES["frequency_penalty"], PENALTIES["repetition_penalty"])
            for token in banned_tokens(bad_words, generated):
                logits[token] = float("-inf")
            generated.append(int(logits.argmax()))
    return generated


@pytest.mark.parametrize("drafter_kind", ["copy", "small"])
@pytest.mark.parametrize("k", [0, 4])
def test_greedy_with_penalties_equals_the_slow_reference(llama_pair, drafter_kind, k):
    """Penalties, a bias and a two-token bad word, greedy, the drafter's q shaped: the
    output is the slow reference's (a drafter that agrees with the target gets long blocks
    accepted, so later positions count drafted tokens)."""
    target, small = llama_pair
    drafter = ModelRunner(copy.deepcopy(target.model)) if drafter_kind == "copy" else small
    bias, bad_words = ((3, 2.0), (17, -4.0)), ((5, 8), (21,))
    for prompt in random_prompts(3, seed=17):
        params = SamplingParams(max_new_tokens=24, logit_bias=bias, bad_words=bad_words,
                                **PENALTIES)
        result = generate(target, prompt, params, drafter, DraftConfig(k),
                          AcceptancePolicy(AcceptanceRule.GREEDY))
        assert result.tokens == _penalized_greedy(target, prompt, 24, bias, bad_words)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_penalties_on_the_changed_columns_equal_the_dense_reference(dtype):
    """``penalize`` computes on the columns of the prompt's and the earlier tokens alone; each
    row equals the slow reference's whole-row computation bit for bit."""
    generator = torch.Generator().manual_seed(3)
    vocab = 500
    for trial in range(20):
        prompt = torch.randint(0, vocab, (int(torch.randint(1, 40, (1,), generator=generator)),),
                               generator=generator).tolist()
        generated = torch.randint(0, vocab, (trial * 3,), generator=generator).tolist()
        histories = [torch.randint(0, vocab, (n,), generator=generator).tolist()
                     for n in range(4)]
        params = SamplingParams(presence_penalty=0.7, frequency_penalty=0.3,
                                repetition_penalty=(1.0, 1.3, 0.8)[trial % 3])
        logits = (torch.randn(len(histories), vocab, generator=generator) * 4).to(dtype)
        rows = logits.clone()
        penalize(rows, histories, params, prompt, generated)
        for row, before, history in zip(rows, logits, histories):
            expected = penalized(before, prompt, generated + history, params.presence_penalty,
                                 params.frequency_penalty, params.repetition_penalty)
            assert torch.equal(row, expected)
