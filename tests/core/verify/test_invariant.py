"""The batch-invariant pass: the logits of a position are bit-identical whatever the pass that
computes them (one-token decoding, a k + 1 chunk, a prefill, a tree, other sessions' rows of
other lengths), in float32 and bfloat16, so speculation never changes greedy output."""

import pytest
import torch

from cascade.core.verify.engine import Pass, VerifyEngine
from cascade.core.forward.invariant import KEY_BLOCK
from cascade.core.forward.row_rules import RowRule, _counts, _rows_invariant, probe
from cascade.core.loop import generate
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import DEVICE, random_prompts, tiny_gemma2, tiny_gpt2, tiny_llama, tiny_mistral

DTYPES = [torch.float32, torch.bfloat16]
MODELS = [tiny_llama, tiny_gpt2, tiny_mistral, tiny_gemma2]
LENGTH = 2 * KEY_BLOCK + 20
"""Positions per sequence: the key spans cross two block boundaries."""


def _unverified_off_the_cpu(verified: bool) -> None:
    """On a GPU no row rule makes cuBLAS's products row-invariant (it picks its kernel by the
    row count): the batch-invariant pass is unverified there, a known gap, not a regression."""
    if not verified and DEVICE != "cpu":
        pytest.xfail(f"the row rules are not verified on {DEVICE} (row-count-dependent kernels)")


def _target(make, dtype):
    runner = make(0)
    runner.model.to(dtype)
    return runner


def _tokens(seed: int, length: int = LENGTH) -> list[int]:
    return torch.randint(3, 90, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _decoded(engine: VerifyEngine, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] the logits of every position, one token per pass."""
    cache = engine.admit(len(tokens))
    rows = [engine.run([Pass(cache, tokens[: n + 1], 1)])[0].logits[-1]
            for n in range(len(tokens))]
    cache.release()
    return torch.stack(rows)


def _chunked(engine: VerifyEngine, tokens: list[int], prompt_len: int, k: int,
             others: list[list[int]]) -> torch.Tensor:
    """The same logits from a prefill of ``prompt_len`` tokens and then k + 1 tokens per pass,
    every pass shared with rows of ``others`` (each at its own length, one to five tokens)."""
    cache = engine.admit(len(tokens))
    side = [engine.admit(len(o)) for o in others]
    first = engine.run([Pass(cache, tokens[:prompt_len], prompt_len)])[0].logits
    rows, held = [first], prompt_len
    while held < len(tokens):
        end = min(len(tokens), held + k + 1)
        passes = [Pass(cache, tokens[:end], end - held)]
        passes += [Pass(c, o[: min(len(o), held + 1 + i % 5)], 1)
                   for i, (c, o) in enumerate(zip(side, others))]
        rows.append(engine.run(passes)[0].logits)
        held = end
    for c in [cache, *side]:
        c.release()
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", MODELS)
def test_a_position_gets_the_same_logits_from_every_pass(make, dtype):
    engine = VerifyEngine(_target(make, dtype), kv_tokens=16 * LENGTH)
    _unverified_off_the_cpu(engine.invariance_verified)
    assert engine.invariance_verified
    tokens = _tokens(1)
    reference = _decoded(engine, tokens)
    others = [_tokens(seed, length) for seed, length in ((2, 40), (3, LENGTH), (4, 90))]
    for prompt_len, k in ((1, 1), (7, 4), (KEY_BLOCK - 2, 4), (30, 15)):
        chunked = _chunked(engine, tokens, prompt_len, k, others)
        assert torch.equal(chunked, reference), (prompt_len, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", [tiny_llama, tiny_mistral])
def test_a_tree_node_gets_the_logits_of_its_path(make, dtype):
    engine = VerifyEngine(_target(make, dtype), kv_tokens=16 * LENGTH)
    tokens = _tokens(5)
    reference = _decoded(engine, tokens)
    # a tree after position ``base``: the true path 0 -> 2 -> 4, with decoys beside it
    parents = (-1, -1, 0, 0, 2, 1)
    for base in (20, KEY_BLOCK - 2, 2 * KEY_BLOCK - 1):
        truth = tokens[base : base + 3]
        nodes = [truth[0], 3, truth[1], 4, truth[2], 5]
        cache, other = engine.admit(LENGTH), engine.admit(LENGTH)
        out = engine.run([Pass(cache, tokens[:base] + nodes, len(nodes) + 1, parents=parents),
                          Pass(other, tokens[: base + 9], 9)])[0].logits
        cache.release()
        other.release()
        path_rows = out[[0, 1, 3, 5]]  # the root, then nodes 0, 2, 4
        assert torch.equal(path_rows, reference[base - 1 : base + 3]), base


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_greedy_with_speculation_equals_k0_greedy(dtype):
    target = _target(tiny_llama, dtype)
    drafter = tiny_llama(1, num_layers=1)
    drafter.model.to(dtype)
    params = SamplingParams(max_new_tokens=48)
    configs = [DraftConfig(num_draft_tokens=k, method="model") for k in (1, 4)]
    configs.append(DraftConfig(num_draft_tokens=4, method="model", tree_nodes=8))
    for prompt in random_prompts(6, seed=9, min_len=3, max_len=70):
        alone = generate(target, prompt, params, drafter, DraftConfig(num_draft_tokens=0))
        for config in configs:
            assert generate(target, prompt, params, drafter, config).tokens == alone.tokens


def test_the_probe_finds_rules_and_sees_a_row_dependent_product():
    verified = probe(tiny_llama(0).model).verified
    _unverified_off_the_cpu(verified)
    assert verified
    weight = torch.randn(32, 16)

    def tail_differs(x):  # what a kernel with its own path for a short tail does
        out = x @ weight.T
        if x.shape[0] % 4:
            out[-(x.shape[0] % 4):] += 1e-3
        return out

    generator = torch.Generator().manual_seed(0)
    assert not _rows_invariant(tail_differs, 16, torch.float32, _counts(RowRule(1, 2)),
                               generator)
    assert _rows_invariant(tail_differs, 16, torch.float32, _counts(RowRule(4, 4)), generator)


def test_the_plain_pass_is_still_available():
    engine = VerifyEngine(tiny_llama(0), kv_tokens=LENGTH, invariant=False)
    assert engine.invariance is None and not engine.invariance_verified
    tokens = _tokens(6, 20)
    cache = engine.admit(len(tokens))
    logits = engine.run([Pass(cache, tokens, 3)])[0].logits
    assert logits.shape[0] == 3 and torch.isfinite(logits).all()


def _fed_one_by_one(runner, tokens: list[int]) -> torch.Tensor:
    cache = runner.new_cache()
    return torch.stack([cache.extend([t], 1).logits[-1] for t in tokens])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make", [tiny_llama, tiny_mistral, tiny_gemma2])
def test_a_drafters_cache_gives_the_same_logits_however_it_is_fed(make, dtype):
    runner = _target(make, dtype)
    runner.set_invariant()
    tokens = _tokens(7)
    reference = _fed_one_by_one(runner, tokens)
    cache = runner.new_cache()
    chunks = [cache.extend(tokens[:30], 0).logits]
    for start in range(30, len(tokens), 7):
        chunks.append(cache.extend(tokens[start : start + 7], 0).logits)
    assert torch.equal(torch.cat(chunks), reference)
    cache.rollback(KEY_BLOCK - 3)  # a rejected tail, fed again as one block
    again = cache.forward_to(tokens, num_logits=len(tokens) - KEY_BLOCK + 3).logits
    assert torch.equal(again, reference[KEY_BLOCK - 3 :])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_branches_give_each_row_what_it_gets_alone(dtype):
    from cascade.core.model.branches import Branches

    runner = _target(tiny_llama, dtype)
    runner.set_invariant()
    tokens = _tokens(8, 90)
    tails = [_tokens(seed, n) for seed, n in ((9, 1), (10, 3), (11, 2), (12, 5), (13, 4))]
    branches = Branches(runner.new_cache(), tokens, len(tails))
    fed = [[] for _ in tails]
    for step in range(3):  # the rows feed different numbers of tokens per step
        rows = [t[:1] if step else t for t in tails] if step < 2 else [[5]] * len(tails)
        logits = branches.feed(rows)
        for b, row in enumerate(rows):
            fed[b] += row
            alone = runner.new_cache().extend(tokens + fed[b], 1).logits[-1]  # one block:
            assert torch.equal(logits[b], alone), (step, b)  # the same, as the test above shows
