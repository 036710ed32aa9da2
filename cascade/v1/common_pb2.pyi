from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcceptanceRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCEPTANCE_RULE_UNSPECIFIED: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_GREEDY: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_SPECULATIVE: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_POINT_MASS: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_KEYED: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_RECURSIVE: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_CHOW: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_DIFF: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_OPT: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_TOKEN_V1: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_TOKEN_V2: _ClassVar[AcceptanceRule]
    ACCEPTANCE_RULE_TOKEN_V3: _ClassVar[AcceptanceRule]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]

class Speculation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATION_UNSPECIFIED: _ClassVar[Speculation]
    SPECULATION_MISS: _ClassVar[Speculation]
    SPECULATION_CACHE_HIT: _ClassVar[Speculation]
    SPECULATION_AHEAD_HIT: _ClassVar[Speculation]
ACCEPTANCE_RULE_UNSPECIFIED: AcceptanceRule
ACCEPTANCE_RULE_GREEDY: AcceptanceRule
ACCEPTANCE_RULE_SPECULATIVE: AcceptanceRule
ACCEPTANCE_RULE_POINT_MASS: AcceptanceRule
ACCEPTANCE_RULE_KEYED: AcceptanceRule
ACCEPTANCE_RULE_RECURSIVE: AcceptanceRule
ACCEPTANCE_RULE_CHOW: AcceptanceRule
ACCEPTANCE_RULE_DIFF: AcceptanceRule
ACCEPTANCE_RULE_OPT: AcceptanceRule
ACCEPTANCE_RULE_TOKEN_V1: AcceptanceRule
ACCEPTANCE_RULE_TOKEN_V2: AcceptanceRule
ACCEPTANCE_RULE_TOKEN_V3: AcceptanceRule
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
SPECULATION_UNSPECIFIED: Speculation
SPECULATION_MISS: Speculation
SPECULATION_CACHE_HIT: Speculation
SPECULATION_AHEAD_HIT: Speculation

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "stop_token_ids", "logprobs", "min_tokens", "bias_token_ids", "bias_values", "presence_penalty", "frequency_penalty", "repetition_penalty", "bad_words", "grammar", "prompt_logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BIAS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BIAS_VALUES_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: int
    min_tokens: int
    bias_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bias_values: _containers.RepeatedScalarFieldContainer[float]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    bad_words: _containers.RepeatedCompositeFieldContainer[BadWord]
    grammar: Grammar
    prompt_logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[int] = ..., min_tokens: _Optional[int] = ..., bias_token_ids: _Optional[_Iterable[int]] = ..., bias_values: _Optional[_Iterable[float]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., bad_words: _Optional[_Iterable[_Union[BadWord, _Mapping]]] = ..., grammar: _Optional[_Union[Grammar, _Mapping]] = ..., prompt_logprobs: _Optional[int] = ...) -> None: ...

class Grammar(_message.Message):
    __slots__ = ("kind", "spec")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    kind: str
    spec: str
    def __init__(self, kind: _Optional[str] = ..., spec: _Optional[str] = ...) -> None: ...

class BadWord(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class DraftSettings(_message.Message):
    __slots__ = ("num_draft_tokens", "max_proposal_tokens", "send_proposal", "min_confidence", "method", "ngram_max_n", "ngram_min_n", "max_entropy", "adaptive", "planned", "tree_nodes", "tree_branching", "tree_expansion", "prediction")
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROPOSAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEND_PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NGRAM_MAX_N_FIELD_NUMBER: _ClassVar[int]
    NGRAM_MIN_N_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    TREE_BRANCHING_FIELD_NUMBER: _ClassVar[int]
    TREE_EXPANSION_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    num_draft_tokens: int
    max_proposal_tokens: int
    send_proposal: bool
    min_confidence: float
    method: str
    ngram_max_n: int
    ngram_min_n: int
    max_entropy: float
    adaptive: bool
    planned: bool
    tree_nodes: int
    tree_branching: int
    tree_expansion: str
    prediction: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_draft_tokens: _Optional[int] = ..., max_proposal_tokens: _Optional[int] = ..., send_proposal: _Optional[bool] = ..., min_confidence: _Optional[float] = ..., method: _Optional[str] = ..., ngram_max_n: _Optional[int] = ..., ngram_min_n: _Optional[int] = ..., max_entropy: _Optional[float] = ..., adaptive: _Optional[bool] = ..., planned: _Optional[bool] = ..., tree_nodes: _Optional[int] = ..., tree_branching: _Optional[int] = ..., tree_expansion: _Optional[str] = ..., prediction: _Optional[_Iterable[int]] = ...) -> None: ...

class Acceptance(_message.Message):
    __slots__ = ("rule", "alpha")
    RULE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    rule: AcceptanceRule
    alpha: float
    def __init__(self, rule: _Optional[_Union[AcceptanceRule, str]] = ..., alpha: _Optional[float] = ...) -> None: ...

class RoundStats(_message.Message):
    __slots__ = ("num_accepted", "num_drafted", "num_deferred", "num_forced", "num_filled", "draft_us", "verify_us", "round_us", "speculation", "num_predrafted", "num_sent_ahead", "draft_source", "num_unverified")
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTED_FIELD_NUMBER: _ClassVar[int]
    NUM_DEFERRED_FIELD_NUMBER: _ClassVar[int]
    NUM_FORCED_FIELD_NUMBER: _ClassVar[int]
    NUM_FILLED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_US_FIELD_NUMBER: _ClassVar[int]
    VERIFY_US_FIELD_NUMBER: _ClassVar[int]
    ROUND_US_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    NUM_PREDRAFTED_FIELD_NUMBER: _ClassVar[int]
    NUM_SENT_AHEAD_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NUM_UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    num_accepted: int
    num_drafted: int
    num_deferred: int
    num_forced: int
    num_filled: int
    draft_us: int
    verify_us: int
    round_us: int
    speculation: Speculation
    num_predrafted: int
    num_sent_ahead: int
    draft_source: str
    num_unverified: int
    def __init__(self, num_accepted: _Optional[int] = ..., num_drafted: _Optional[int] = ..., num_deferred: _Optional[int] = ..., num_forced: _Optional[int] = ..., num_filled: _Optional[int] = ..., draft_us: _Optional[int] = ..., verify_us: _Optional[int] = ..., round_us: _Optional[int] = ..., speculation: _Optional[_Union[Speculation, str]] = ..., num_predrafted: _Optional[int] = ..., num_sent_ahead: _Optional[int] = ..., draft_source: _Optional[str] = ..., num_unverified: _Optional[int] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("round", "tokens", "committed_len", "finish_reason", "drafted_tokens", "drafted_parents", "path", "logprobs", "prompt_logprobs", "stats")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_PARENTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    round: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    committed_len: int
    finish_reason: FinishReason
    drafted_tokens: _containers.RepeatedScalarFieldContainer[int]
    drafted_parents: _containers.RepeatedScalarFieldContainer[int]
    path: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    stats: RoundStats
    def __init__(self, round: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., committed_len: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., drafted_tokens: _Optional[_Iterable[int]] = ..., drafted_parents: _Optional[_Iterable[int]] = ..., path: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., stats: _Optional[_Union[RoundStats, _Mapping]] = ...) -> None: ...
