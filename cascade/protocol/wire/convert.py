"""Conversions between the protocol's dataclasses and the cascade.v1 protobuf messages.

Only the generated ``*_pb2`` modules are imported here (they need protobuf, neither grpc nor
torch). Conversions from protobuf raise ValueError naming the field when a value is out of range.
"""

from __future__ import annotations

from cascade.protocol.grammar import Grammar
from cascade.protocol.methods import DEFAULT_DRAFT_METHOD
from cascade.protocol.settings import DraftConfig, FinishReason, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.logprobs import TokenLogprobs
from cascade.v1 import common_pb2

FINISH_TO_PB = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
}
FINISH_FROM_PB = {value: key for key, value in FINISH_TO_PB.items()}
RULE_TO_PB = {rule: common_pb2.AcceptanceRule.Value(f"ACCEPTANCE_RULE_{rule.name}")
              for rule in AcceptanceRule}
RULE_FROM_PB = {value: key for key, value in RULE_TO_PB.items()}


def sampling_to_pb(params: SamplingParams) -> common_pb2.Sampling:
    return common_pb2.Sampling(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        seed=params.seed, max_new_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids), logprobs=params.logprobs,
        min_tokens=params.min_tokens,
        bias_token_ids=[t for t, _ in params.logit_bias],
        bias_values=[b for _, b in params.logit_bias],
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        bad_words=[common_pb2.BadWord(token_ids=w) for w in params.bad_words],
        grammar=grammar_to_pb(params.grammar), prompt_logprobs=params.prompt_logprobs,
    )


def sampling_from_pb(msg: common_pb2.Sampling) -> SamplingParams:
    return SamplingParams(
        temperature=msg.temperature, top_k=msg.top_k, top_p=msg.top_p, seed=msg.seed,
        max_new_tokens=msg.max_new_tokens, stop_token_ids=tuple(msg.stop_token_ids),
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        min_tokens=msg.min_tokens,
        logit_bias=tuple(zip(msg.bias_token_ids, msg.bias_values)),
        presence_penalty=msg.presence_penalty, frequency_penalty=msg.frequency_penalty,
        repetition_penalty=msg.repetition_penalty or 1.0,
        bad_words=tuple(tuple(w.token_ids) for w in msg.bad_words),
        grammar=grammar_from_pb(msg.grammar) if msg.HasField("grammar") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
    )


def grammar_to_pb(grammar: Grammar | None) -> common_pb2.Grammar | None:
    return None if grammar is None else common_pb2.Grammar(kind=grammar.kind, spec=grammar.spec)


def grammar_from_pb(msg: common_pb2.Grammar) -> Grammar:
    """The message's grammar (ValueError: an unknown kind or an over-long spec)."""
    return Grammar(msg.kind, msg.spec)


def draft_settings_to_pb(config: DraftConfig) -> common_pb2.DraftSettings:
    return common_pb2.DraftSettings(
        num_draft_tokens=config.num_draft_tokens,
        max_proposal_tokens=config.max_proposal_tokens,
        send_proposal=config.send_proposal,
        min_confidence=config.min_confidence,
        method=config.method,
        ngram_max_n=config.ngram_max_n,
        ngram_min_n=config.ngram_min_n,
        max_entropy=config.max_entropy,
        adaptive=config.adaptive,
        planned=config.planned,
        tree_nodes=config.tree_nodes,
        tree_branching=config.tree_branching,
        tree_expansion=config.tree_expansion,
        prediction=config.prediction,
    )


def draft_settings_from_pb(msg: common_pb2.DraftSettings) -> DraftConfig:
    defaults = DraftConfig()
    return DraftConfig(
        num_draft_tokens=msg.num_draft_tokens,
        max_proposal_tokens=msg.max_proposal_tokens,
        send_proposal=msg.send_proposal,
        min_confidence=msg.min_confidence,
        method=msg.method or DEFAULT_DRAFT_METHOD,
        ngram_max_n=msg.ngram_max_n or defaults.ngram_max_n,
        ngram_min_n=msg.ngram_min_n or defaults.ngram_min_n,
        max_entropy=msg.max_entropy,
        adaptive=msg.adaptive,
        planned=msg.planned,
        tree_nodes=msg.tree_nodes,
        tree_branching=msg.tree_branching or defaults.tree_branching,
        tree_expansion=msg.tree_expansion or defaults.tree_expansion,
        prediction=tuple(msg.prediction),
    )


def acceptance_to_pb(policy: AcceptancePolicy) -> common_pb2.Acceptance:
    return common_pb2.Acceptance(rule=RULE_TO_PB[policy.rule], alpha=policy.alpha)


def acceptance_from_pb(msg: common_pb2.Acceptance, sampling: SamplingParams) -> AcceptancePolicy:
    """The session's policy; an unspecified rule is the default for its temperature (alpha is
    checked either way)."""
    if msg.rule == common_pb2.ACCEPTANCE_RULE_UNSPECIFIED:
        return AcceptancePolicy(AcceptancePolicy.default_for(sampling).rule, msg.alpha)
    if msg.rule not in RULE_FROM_PB:
        raise ValueError(f"rule must be one of {sorted(RULE_FROM_PB)} (0: chosen by "
                         f"temperature), got {msg.rule}")
    policy = AcceptancePolicy(RULE_FROM_PB[msg.rule], msg.alpha)
    policy.check(sampling)
    return policy


def logprobs_to_pb(items) -> list[common_pb2.TokenLogprobs]:
    """``cascade.protocol.logprobs.TokenLogprobs`` items as their wire messages."""
    return [common_pb2.TokenLogprobs(logprob=t.logprob, top_ids=t.top_ids,
                                     top_logprobs=t.top_logprobs) for t in items]


def logprobs_from_pb(msgs) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(t.logprob, tuple(t.top_ids), tuple(t.top_logprobs)) for t in msgs)
