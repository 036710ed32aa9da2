"""Token trees in the verifier: a tree pass equals a plain forward of each root-to-node path,
the accepted path's KV entries are compacted into place, and hostile trees are refused with the
field named."""

import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.trees import ancestor_mask, children, path_to
from cascade.protocol.trees import depths, tree_problem
from cascade.core.verify.verification import InvalidDraft, SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import hf_greedy, tiny_gemma2, tiny_llama, tiny_mistral

PARENTS = [-1, -1, 0, 0, 1, 2, 4, -1]
TOKENS = [5, 9, 11, 7, 3, 8, 2, 14]


def _path_logits(runner, prefix, parents, tokens, node):
    """The target's logits after ``node`` by a plain forward of prefix + its path."""
    path = [tokens[i] for i in path_to(parents, node)]
    return runner.new_cache().forward_to(prefix + path, num_logits=1).logits[-1]


def test_tree_helpers():
    assert depths(PARENTS) == [1, 1, 2, 2, 2, 3, 3, 1]
    assert children(PARENTS)[0] == [0, 1, 7] and children(PARENTS)[1] == [2, 3]
    assert path_to(PARENTS, 6) == [1, 4, 6]
    mask = ancestor_mask(PARENTS)
    assert mask[6].nonzero().flatten().tolist() == [1, 4, 6]
    assert tree_problem([-1, 1]) and "parent" in tree_problem([-1, 1])
    assert tree_problem([-1, 0, 0], max_nodes=2) is not None
    assert tree_problem([-1, 0, 1], max_depth=2) is not None
    assert tree_problem(PARENTS) is None


@pytest.mark.parametrize("make", [tiny_llama, tiny_mistral, tiny_gemma2])
def test_a_tree_pass_equals_a_plain_forward_of_every_path(make):
    target = make(0)
    engine = VerifyEngine(target, kv_tokens=512)
    prefix = list(range(3, 14))
    sequence = SequenceVerifier(target, prefix, SamplingParams(max_new_tokens=16),
                                engine=engine)
    draft = Draft(list(TOKENS), parents=list(PARENTS))
    output = engine.run([sequence.plan(draft)])[0]
    assert output.logits.shape[0] == len(TOKENS) + 1
    root = target.new_cache().forward_to(prefix, num_logits=1).logits[-1]
    torch.testing.assert_close(output.logits[0], root, atol=1e-4, rtol=1e-4)
    for node in range(len(TOKENS)):
        expected = _path_logits(target, prefix, PARENTS, TOKENS, node)
        torch.testing.assert_close(output.logits[node + 1], expected, atol=1e-4, rtol=1e-4)
    sequence.close()


def _greedy_tree(target, prefix, reference):
    """A tree whose accepted path is reference[0], reference[1] (through node 1 and 4), with
    decoys around it: the target's greedy continuation is kept, the decoys are not."""
    decoy = [(t + 1) % 64 for t in reference]
    return Draft([decoy[0], reference[0], decoy[1], reference[1], decoy[2]],
                 parents=[-1, -1, 1, 1, 3])


@pytest.mark.parametrize("make", [tiny_llama, tiny_mistral])
def test_greedy_trees_commit_the_targets_greedy_tokens_and_compact_the_path(make):
    target = make(0)
    prefix = [4, 9, 2, 7, 1]
    reference = hf_greedy(target, prefix, 12)
    engine = VerifyEngine(target, kv_tokens=512)
    sequence = SequenceVerifier(target, prefix, SamplingParams(max_new_tokens=12),
                                engine=engine)
    outcome = sequence.verify(_greedy_tree(target, prefix, reference))
    assert outcome.path == (1, 3) and outcome.num_accepted == 2
    assert outcome.tokens == reference[:3]
    assert sequence.cache.tokens == prefix + reference[:2]
    while not sequence.is_finished:  # the compacted cache serves the following rounds
        sequence.verify(Draft([]))
    assert sequence.generated == reference
    sequence.close()


def test_hostile_trees_are_refused_with_the_field_named():
    target = tiny_llama(0)
    sequence = SequenceVerifier(target, [1, 2, 3], SamplingParams(max_new_tokens=8))
    for parents in ([-1, 1, 0], [-1, 0, 5], [0, -1, -1]):
        with pytest.raises(InvalidDraft, match="^parents: "):
            sequence.verify(Draft([1, 2, 3], parents=parents))
    with pytest.raises(InvalidDraft, match="^parents: 70 nodes"):
        sequence.verify(Draft([1] * 70, parents=[-1] * 70))
    with pytest.raises(InvalidDraft, match="^tokens: "):
        sequence.verify(Draft([1, 10**6], parents=[-1, -1]))
    sampled = SequenceVerifier(target, [1, 2, 3], SamplingParams(temperature=0.8, seed=1,
                                                                 max_new_tokens=8))
    with pytest.raises(InvalidDraft, match="^parents: .*rule is speculative"):
        sampled.verify(Draft([1, 2], parents=[-1, -1]))
    keyed = SequenceVerifier(target, [1, 2, 3], SamplingParams(temperature=0.8, seed=1,
                                                               max_new_tokens=8),
                             policy=AcceptancePolicy(AcceptanceRule.KEYED))
    keyed.verify(Draft([1, 2], parents=[-1, -1]))
    for s in (sequence, sampled, keyed):
        s.close()
