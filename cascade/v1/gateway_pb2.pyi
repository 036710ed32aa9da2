from cascade.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResumeRequest(_message.Message):
    __slots__ = ("session_id", "after_round")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_round: int
    def __init__(self, session_id: _Optional[str] = ..., after_round: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "num_draft_tokens", "chat", "max_tokens", "temperature", "top_p", "top_k", "seed", "draft_method", "stop", "acceptance", "cascade_rule", "cascade_alpha", "draft_schedule", "draft_min_confidence", "draft_max_entropy", "draft_tree_nodes", "draft_tree_branching", "draft_tree_expansion", "logprobs", "stop_token_ids", "min_tokens", "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "bad_words", "structured_output", "prompt_logprobs", "prediction")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_METHOD_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    CASCADE_RULE_FIELD_NUMBER: _ClassVar[int]
    CASCADE_ALPHA_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MAX_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TREE_BRANCHING_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TREE_EXPANSION_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    num_draft_tokens: int
    chat: bool
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    draft_method: str
    stop: _containers.RepeatedScalarFieldContainer[str]
    acceptance: str
    cascade_rule: str
    cascade_alpha: float
    draft_schedule: str
    draft_min_confidence: float
    draft_max_entropy: float
    draft_tree_nodes: int
    draft_tree_branching: int
    draft_tree_expansion: str
    logprobs: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_tokens: int
    logit_bias: _containers.ScalarMap[str, float]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    structured_output: _common_pb2.Grammar
    prompt_logprobs: int
    prediction: str
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., num_draft_tokens: _Optional[int] = ..., chat: _Optional[bool] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., draft_method: _Optional[str] = ..., stop: _Optional[_Iterable[str]] = ..., acceptance: _Optional[str] = ..., cascade_rule: _Optional[str] = ..., cascade_alpha: _Optional[float] = ..., draft_schedule: _Optional[str] = ..., draft_min_confidence: _Optional[float] = ..., draft_max_entropy: _Optional[float] = ..., draft_tree_nodes: _Optional[int] = ..., draft_tree_branching: _Optional[int] = ..., draft_tree_expansion: _Optional[str] = ..., logprobs: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., min_tokens: _Optional[int] = ..., logit_bias: _Optional[_Mapping[str, float]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., bad_words: _Optional[_Iterable[str]] = ..., structured_output: _Optional[_Union[_common_pb2.Grammar, _Mapping]] = ..., prompt_logprobs: _Optional[int] = ..., prediction: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("session_id", "text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens", "accepted_text", "round", "drafted_tokens", "drafted_parents", "path", "logprobs", "prompt_token_ids", "prompt_logprobs", "accepted_prediction_tokens", "rejected_prediction_tokens", "stats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TEXT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_PARENTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PREDICTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_PREDICTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: _common_pb2.FinishReason
    prompt_tokens: int
    completion_tokens: int
    accepted_text: str
    round: int
    drafted_tokens: _containers.RepeatedScalarFieldContainer[int]
    drafted_parents: _containers.RepeatedScalarFieldContainer[int]
    path: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    stats: _common_pb2.RoundStats
    def __init__(self, session_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., accepted_text: _Optional[str] = ..., round: _Optional[int] = ..., drafted_tokens: _Optional[_Iterable[int]] = ..., drafted_parents: _Optional[_Iterable[int]] = ..., path: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., accepted_prediction_tokens: _Optional[int] = ..., rejected_prediction_tokens: _Optional[int] = ..., stats: _Optional[_Union[_common_pb2.RoundStats, _Mapping]] = ...) -> None: ...
