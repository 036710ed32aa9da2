"""The speculation memory: its index against a naive search, scopes, eviction, draft scoring
against a slow reference, and suffix drafting in the loop (exact, and accepted)."""

from collections import Counter

import numpy as np
import pytest

from cascade.core.memory import suffix_index
from cascade.core.memory.suffix_draft import SuffixParams, best_draft, follow
from cascade.core.memory.suffix_index import SessionMemory, SuffixIndex
from cascade.core.memory.candidates import SEEDS, Candidates, MemoryLimits, context_candidates

DEPTH = 8
LIMITS = MemoryLimits(max_depth=DEPTH, max_candidates=10_000)


def naive_candidates(sequences: list[list[int]], context: list[int]) -> Counter:
    """(match length, continuation) of every place in ``sequences`` that matches the end of
    ``context`` by at least the smallest seed, by brute force."""
    found = Counter()
    for seq in sequences:
        for place in range(1, len(seq)):
            match = 0
            while (match < min(DEPTH, place, len(context))
                   and seq[place - 1 - match] == context[-1 - match]):
                match += 1
            if match >= min(SEEDS):
                after = tuple(seq[place:place + DEPTH]) + (-1,) * (DEPTH - len(seq[place:]))
                found[match, after[:DEPTH]] += 1
    return found


def as_counter(found: Candidates) -> Counter:
    return Counter(zip(found.match_lens.tolist(), map(tuple, found.continuations.tolist())))


def repetitive_sequences(seed: int, num: int, vocab: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(3, 30)).tolist() for _ in range(num)]


@pytest.mark.parametrize("seed", range(4))
def test_index_answers_equal_a_naive_search(seed):
    index = SuffixIndex(LIMITS)
    mine, others = repetitive_sequences(seed, 40), repetitive_sequences(seed + 100, 40)
    for a, b in zip(mine, others):
        index.add(a, "key-a")
        index.add(b, "key-b")
        if seed % 2:
            index.merge()  # sorted arrays and the latest entries answer alike
    rng = np.random.default_rng(seed)
    for _ in range(30):
        context = rng.integers(0, 6, rng.integers(2, 12)).tolist()
        assert as_counter(index.candidates(context, "key-a")) == naive_candidates(mine, context)


def test_the_session_context_is_searched_like_the_memory():
    rng = np.random.default_rng(7)
    for _ in range(30):
        context = rng.integers(0, 5, rng.integers(1, 40)).tolist()
        assert as_counter(context_candidates(context, LIMITS)) == naive_candidates([context],
                                                                                   context)


def test_one_scope_never_sees_another_even_when_their_hashes_collide(monkeypatch):
    monkeypatch.setattr(suffix_index, "scope_key", lambda scope: np.uint64(7))  # all collide
    index = SuffixIndex(LIMITS)
    index.add([1, 2, 3, 4, 5, 6], "key-a")
    assert index.candidates([9, 2, 3], "key-b").num == 0
    assert index.candidates([9, 2, 3], "key-a").num == 1


def test_oldest_sequences_are_evicted_past_the_limits():
    index = SuffixIndex(MemoryLimits(max_sequences=3, max_tokens=1000, max_depth=DEPTH))
    for i in range(6):
        index.add([100 + i, 1, 2, 3, 50 + i], "k")
    assert index.num_sequences == 3
    assert sorted(set(index.candidates([1, 2, 3], "k").continuations[:, 0].tolist())) == [
        53, 54, 55]
    by_tokens = SuffixIndex(MemoryLimits(max_sequences=100, max_tokens=25, max_depth=DEPTH))
    for i in range(20):
        by_tokens.add([7, 8, 9, i, i], "k")
        by_tokens.merge()
    assert by_tokens.num_tokens == 25  # five sequences of five tokens
    assert by_tokens.candidates([7, 8, 9], "k").continuations[:, 0].tolist() == [19, 18, 17,
                                                                                 16, 15]


def test_a_long_sequence_is_kept_within_max_tokens():
    index = SuffixIndex(MemoryLimits(max_tokens=50, max_depth=DEPTH))
    index.add(list(range(200)), "k")
    assert index.num_tokens == 50
    assert index.candidates([180, 181], "k").continuations[0, 0] == 182


def reference_path(rows: list[list[int]], min_prob: float) -> tuple[list[int], list[float]]:
    """SuffixDecoding's path walk with dicts: the most frequent child, ties to the row that
    comes first (the most recent)."""
    tokens, probs, prob = [], [], 1.0
    alive = list(range(len(rows)))
    for j in range(len(rows[0]) if rows else 0):
        counts = Counter(rows[i][j] for i in alive if rows[i][j] != -1)
        if not counts:
            break
        first = {t: min(i for i in alive if rows[i][j] == t) for t in counts}
        token = min(counts, key=lambda t: (-counts[t], first[t]))
        prob *= counts[token] / len(alive)
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        alive = [i for i in alive if rows[i][j] == token]
    return tokens, probs


@pytest.mark.parametrize("seed", range(20))
def test_path_walk_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3, (rng.integers(1, 12), 6))
    rows[rng.random(rows.shape) < 0.1] = -1
    rows = np.where(np.cumsum(rows == -1, axis=1) > 0, -1, rows)
    tokens, probs = follow(rows, 0.1)
    ref_tokens, ref_probs = reference_path(rows.tolist(), 0.1)
    assert tokens == ref_tokens
    assert np.allclose(probs, ref_probs)


def test_the_best_scoring_match_length_wins_and_longer_matches_reach_further():
    continuations = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [9, 9, 9, 9], [9, 9, 9, 9],
                              [9, 9, 9, 9]])
    found = Candidates(np.array([4, 4, 2, 2, 2]), continuations)
    draft = best_draft(found, 4)
    assert draft.tokens == [5, 6, 7, 8] and draft.match_len == 4  # 4.0 beats 0.6 * 4
    short = best_draft(found, 4, SuffixParams(max_spec_factor=0.5))
    assert short.tokens == [5, 6]  # a 4-token match reaches 2 tokens at factor 0.5


@pytest.mark.parametrize("seed", range(10))
def test_trees_keep_parents_before_children_and_the_most_probable_nodes(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3, (12, 5))
    found = Candidates(np.full(12, 4), rows)
    tree = best_draft(found, 5, tree_nodes=8)
    assert 0 < len(tree.tokens) <= 8
    for i, parent in enumerate(tree.parents):
        assert parent < i
        if parent >= 0:
            assert tree.probs[parent] >= tree.probs[i] - 1e-12
    paths = Counter()
    for row in rows.tolist():
        for depth in range(1, 6):
            paths[tuple(row[:depth])] += 1
    kept = []
    for i in range(len(tree.tokens)):
        node, path = i, []
        while node >= 0:
            path.insert(0, tree.tokens[node])
            node = tree.parents[node]
        kept.append(tuple(path))
        assert tree.probs[i] == pytest.approx(paths[tuple(path)] / 12)
    dropped = [n / 12 for p, n in paths.items() if p not in kept and n / 12 >= 0.1]
    assert all(d <= min(tree.probs) for d in dropped)


def test_suffix_drafting_in_the_loop_is_exact_and_drafts_from_the_memory(gpt2_pair):
    from cascade.core.loop import generate
    from cascade.protocol.settings import DraftConfig, SamplingParams
    from models import random_prompts

    target, drafter = gpt2_pair
    params = SamplingParams(max_new_tokens=30)
    index = SuffixIndex()
    prompts = random_prompts(3, seed=43)
    for prompt in prompts:
        expected = generate(target, prompt, params).tokens
        for method, model in (("suffix", None), ("suffix_then_model", drafter)):
            memory = SessionMemory(index, "k")
            result = generate(target, prompt, params, model, DraftConfig(4, method=method),
                              memory=memory)
            assert result.tokens == expected
        index.add(prompt + expected, "k")
    # The same prompt again: the memory holds its answer, drafted in long blocks.
    again = generate(target, prompts[0], params, None, DraftConfig(4, method="suffix"),
                     memory=SessionMemory(index, "k"))
    assert again.stats.num_accepted_tokens >= 25
    assert again.stats.num_target_passes <= 4
    stranger = generate(target, prompts[0], params, None, DraftConfig(4, method="suffix"),
                        memory=SessionMemory(index, "someone else"))
    assert stranger.stats.num_accepted_tokens < again.stats.num_accepted_tokens


def test_sampling_with_memory_drafts_keeps_the_targets_distribution(gpt2_pair):
    """Memory drafts carry no q (verified as point masses): the first emitted token of a
    sampled generation is distributed as the target's p, whether the memory proposes a likely
    token or an unlikely one (chi-square over the target's likeliest tokens, the rest pooled)."""
    import torch

    from scipy.stats import chisquare

    from cascade.core.loop import generate
    from cascade.protocol.settings import DraftConfig, SamplingParams
    from models import full_forward, random_prompts

    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=45)[0]
    with torch.no_grad():
        p = torch.softmax(full_forward(target.model, prompt).logits[0, -1].double(), -1)
    order = torch.argsort(p, descending=True).tolist()
    for proposed in (order[0], order[5]):
        index = SuffixIndex()
        index.add(prompt + [proposed, 1, 2], "k")
        counts = Counter()
        for seed in range(1500):
            params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed)
            result = generate(target, prompt, params, None, DraftConfig(4, method="suffix"),
                              memory=SessionMemory(index, "k"))
            assert result.stats.num_draft_tokens == 1  # the memory drafted every time
            counts[result.tokens[0]] += 1
        top = order[:8]
        observed = [counts[t] for t in top] + [1500 - sum(counts[t] for t in top)]
        expected = [1500 * float(p[t]) for t in top] + [1500 * float(1 - p[top].sum())]
        assert chisquare(observed, expected).pvalue > 1e-3


def test_the_memory_metrics_read_the_index():
    from cascade.serving.metrics import MemoryCollector

    index = SuffixIndex(LIMITS)
    index.add([1, 2, 3, 4], "k")
    index.candidates([9, 2, 3], "k")
    index.candidates([9, 8, 7], "k")
    families = {f.name: {tuple(s.labels.values()): s.value for s in f.samples}
                for f in MemoryCollector(index).collect()}
    assert families["cascade:memory_indexed"] == {("sequences",): 1, ("tokens",): 4}
    assert families["cascade:memory_lookups"] == {("hit",): 1, ("miss",): 1}
