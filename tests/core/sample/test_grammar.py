"""The grammar processor against the slow reference: masks for chains and trees equal a fresh
matcher's after each row's history, and greedy output under a grammar (target alone, chains,
trees, in-process) equals the target's masked greedy decoding token for token and parses."""

import json

import jsonschema
import torch

import pytest

from cascade.core.sample.grammar import GrammarMatcher
from cascade.core.loop import generate
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.grammar import Grammar, grammar_problem
from cascade.protocol.settings import DraftConfig, FinishReason, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.tools.tiny_models import build_tiny_pair
from models import full_forward
from grammar_reference import SCHEMAS, fresh_mask, masked_grammar_rows, masked_greedy

PROMPT = "def main():"
MAX_NEW = 48


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, drafter_dir = build_tiny_pair(tmp_path_factory.mktemp("models"))
    return ModelRunner.load(ModelSpec(str(target_dir))), ModelRunner.load(ModelSpec(str(drafter_dir)))


GRAMMARS = {
    "flat": Grammar.json_schema(SCHEMAS["flat"]),
    "nested": Grammar.json_schema(SCHEMAS["nested"]),
    "regex": Grammar("regex", r"(yes|no), [0-9]{1,3}"),
    "lark": Grammar("lark", 'start: "(" num ("+" num)* ")"\nnum: /[0-9]/'),
    "choice": Grammar.choice(["alpha", "beta \"quoted\"", "gamma"]),
}


def test_masks_follow_each_rows_history(pair):
    """Tree rows (root, siblings, a deeper node): each row's mask is a fresh matcher's after
    the committed tokens plus the row's drafted ancestors; a row behind a forbidden token
    allows everything."""
    target, _ = pair
    grammar = GRAMMARS["flat"]
    ids = target.tokenizer('{"ok":true,"n":', add_special_tokens=False).input_ids
    committed, drafts = ids[:2], ids[2:5]
    matcher = GrammarMatcher(grammar, target.tokenizer, target.vocab_size, committed)
    bad = target.tokenizer("zz", add_special_tokens=False).input_ids[:1]
    histories = [[], drafts[:1], drafts[:2], drafts[:1] + bad, drafts[:1] + bad + drafts[1:2],
                 drafts]
    rows = masked_grammar_rows(matcher, target.vocab_size, histories)
    for r, history in enumerate(histories):
        if bad[0] in history:
            assert bool(rows[r].all())
        else:
            assert rows[r].tolist() == fresh_mask(target, grammar, committed + history).tolist()
    assert rows[0].sum() < target.vocab_size  # the grammar does forbid tokens
    again = masked_grammar_rows(matcher, target.vocab_size, [[]])  # rolled back afterwards
    assert again[0].tolist() == rows[0].tolist()


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@pytest.mark.parametrize("config", [DraftConfig(0), DraftConfig(4),
                                    DraftConfig(4, tree_nodes=8)],
                         ids=["target-alone", "chains", "trees"])
def test_greedy_output_equals_masked_reference(pair, name, config):
    target, drafter = pair
    grammar = GRAMMARS[name]
    prompt = target.tokenizer(PROMPT).input_ids
    eos = target.tokenizer.eos_token_id
    params = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=(eos,),
                            grammar=grammar)
    result = generate(target, prompt, params, drafter, config)
    assert result.tokens == masked_greedy(target, prompt, grammar, MAX_NEW)
    assert result.finish_reason is FinishReason.STOP and result.tokens[-1] == eos
    text = target.tokenizer.decode(result.tokens[:-1])
    if name in SCHEMAS:
        jsonschema.validate(json.loads(text), SCHEMAS[name])


@pytest.mark.parametrize("config, rule", [
    (DraftConfig(4), None), (DraftConfig(4, tree_nodes=8), AcceptanceRule.KEYED),
    (DraftConfig(4, tree_nodes=8), AcceptanceRule.RECURSIVE)],
    ids=["chains", "keyed-trees", "recursive-trees"])
def test_sampled_output_matches_the_grammar(pair, config, rule):
    target, drafter = pair
    eos = target.tokenizer.eos_token_id
    prompt = target.tokenizer(PROMPT).input_ids
    policy = None if rule is None else AcceptancePolicy(rule)
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=MAX_NEW,
                                stop_token_ids=(eos,), grammar=GRAMMARS["nested"])
        result = generate(target, prompt, params, drafter, config, policy)
        assert result.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(target.tokenizer.decode(result.tokens[:-1])),
                            SCHEMAS["nested"])


@pytest.mark.parametrize("grammar, words", [
    (Grammar("json_schema", "{not json"), "valid JSON"),
    (Grammar("json_schema", '{"type": "frobnicate"}'), "frobnicate"),
    (Grammar("regex", "[a-z"), "regex"),
    (Grammar("choice", "[]"), "non-empty list"),
    (Grammar("lark", "start: missing_rule"), "missing_rule"),
])
def test_bad_grammars_are_named(grammar, words):
    problem = grammar_problem(grammar)
    assert problem is not None and words in problem


def test_good_grammars_compile():
    assert all(grammar_problem(g) is None for g in GRAMMARS.values())
    with pytest.raises(ValueError, match="kind"):
        Grammar("yaml", "")


@pytest.mark.parametrize("grammar, field", [
    (dict(kind="regex", spec="(open"), "sampling.grammar"),
    (dict(kind="xml", spec=""), "sampling.grammar"),
    (dict(kind="regex", spec="a" * 70000), "sampling.grammar.spec"),
])
def test_pods_refuse_bad_grammars_naming_the_field(grammar, field):
    from cascade.protocol.limits import RequestInvalid
    from cascade.protocol.wire.validation import ModelLimits, session_settings
    from cascade.v1 import common_pb2, verifier_pb2

    message = verifier_pb2.SessionOpen(
        session_id="s", epoch=1, context_tokens=[1, 2], prompt_len=2,
        sampling=common_pb2.Sampling(top_p=1.0, max_new_tokens=4,
                                     grammar=common_pb2.Grammar(**grammar)))
    with pytest.raises(RequestInvalid) as refused:
        session_settings(message, ModelLimits(vocab_size=96, max_length=256))
    assert refused.value.param == field
    message.sampling.grammar.CopyFrom(common_pb2.Grammar(kind="regex", spec="(yes|no)"))
    assert session_settings(message, ModelLimits(96, 256)).sampling.grammar.spec == "(yes|no)"


def test_masking_the_drafters_q_raises_acceptance_and_changes_nothing(pair, monkeypatch):
    """The drafter masks q with the grammar (chains): greedy output is the same (a sampled one
    follows the same distribution, but which sample depends on q), and more drafted tokens are
    accepted than when it drafts unmasked."""
    import cascade.core.proposers.model as model_proposer

    target, drafter = pair
    eos = target.tokenizer.eos_token_id
    prompt = target.tokenizer(PROMPT).input_ids
    runs = {}
    for masked in (True, False):
        if not masked:
            monkeypatch.setattr(model_proposer, "_grammar_cursor", lambda context: None)
        accepted, outputs = 0, []
        for name in ("flat", "nested", "lark"):
            for temperature in (0.0, 1.0):
                params = SamplingParams(temperature=temperature, seed=3, max_new_tokens=MAX_NEW,
                                        stop_token_ids=(eos,), grammar=GRAMMARS[name])
                result = generate(target, prompt, params, drafter, DraftConfig(4))
                accepted += result.stats.num_accepted_tokens
                if temperature == 0.0:
                    outputs.append(result.tokens)
        runs[masked] = accepted, outputs
    assert runs[True][1] == runs[False][1]
    assert runs[True][0] > runs[False][0]


def test_sampled_first_token_follows_the_masked_target(pair):
    """Speculative sampling under a grammar (k = 3, the drafter's q masked too): the first
    token's frequencies over 400 seeds match the target's masked distribution (chi-square)."""
    from scipy.stats import chisquare

    target, drafter = pair
    prompt = target.tokenizer(PROMPT).input_ids
    grammar = Grammar("regex", r"(if|in|is|it|def|for|return|self)[0-9]")
    allowed = fresh_mask(target, grammar, [])
    with torch.no_grad():
        logits = full_forward(target.model, prompt).logits[0, -1]
    p = torch.softmax(torch.where(allowed, logits, float("-inf")), -1)  # [vocab]
    support = p.nonzero().flatten().tolist()
    counts = dict.fromkeys(support, 0)
    for seed in range(400):
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=4, grammar=grammar)
        first = generate(target, prompt, params, drafter, DraftConfig(3)).tokens[0]
        assert first in counts, "a token the grammar forbids was emitted"
        counts[first] += 1
    mass = sum(p[t].item() for t in support)  # 1 up to float32 rounding, which scipy refuses
    expected = [400 * p[t].item() / mass for t in support]
    assert chisquare([counts[t] for t in support], expected).pvalue > 1e-3


def test_a_row_whose_grammar_allows_no_token_fails_alone(pair):
    """A structured output whose bad_words ban every token its grammar allows next leaves its
    row with no finite logit: that row fails (its tokens break the grammar), and a session
    sharing the step gets its verdict as if alone."""
    from cascade.core.blocks import Draft
    from cascade.core.verify.engine import VerifyEngine
    from cascade.core.verify.verification import SequenceVerifier

    target, _ = pair
    grammar = GRAMMARS["regex"]
    prompt = target.tokenizer.encode(PROMPT)
    allowed = fresh_mask(target, grammar, []).nonzero().flatten().tolist()
    engine = VerifyEngine(target, kv_tokens=1024)
    stuck = SequenceVerifier(target, prompt, SamplingParams(
        max_new_tokens=8, grammar=grammar, bad_words=tuple((t,) for t in allowed)),
        engine=engine)
    other = SequenceVerifier(target, prompt[:-1], SamplingParams(max_new_tokens=8),
                             engine=engine)
    alone = SequenceVerifier(target, prompt[:-1], SamplingParams(max_new_tokens=8),
                             engine=VerifyEngine(target, kv_tokens=1024))
    results = engine.step([(stuck, Draft([])), (other, Draft([]))])
    assert isinstance(results[0], ValueError) and "grammar" in str(results[0])
    assert results[1].tokens == alone.verify(Draft([])).tokens
    assert other.committed == alone.committed
