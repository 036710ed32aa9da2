from cascade.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifyRequest(_message.Message):
    __slots__ = ("open", "block", "shadow", "ready")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    open: SessionOpen
    block: DraftBlock
    shadow: ShadowBlock
    ready: DraftReady
    def __init__(self, open: _Optional[_Union[SessionOpen, _Mapping]] = ..., block: _Optional[_Union[DraftBlock, _Mapping]] = ..., shadow: _Optional[_Union[ShadowBlock, _Mapping]] = ..., ready: _Optional[_Union[DraftReady, _Mapping]] = ...) -> None: ...

class DraftReady(_message.Message):
    __slots__ = ("epoch", "num_tokens")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_tokens: int
    def __init__(self, epoch: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ShadowBlock(_message.Message):
    __slots__ = ("epoch", "base_len", "tokens", "parents")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    base_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., base_len: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ...) -> None: ...

class SessionOpen(_message.Message):
    __slots__ = ("session_id", "epoch", "context_tokens", "prompt_len", "sampling", "acceptance", "feature_layers", "owner_tag", "plan_drafts", "draft_method", "shadow_drafts", "tree_nodes", "num_draft_tokens", "prefix_scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    OWNER_TAG_FIELD_NUMBER: _ClassVar[int]
    PLAN_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_METHOD_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    context_tokens: _containers.RepeatedScalarFieldContainer[int]
    prompt_len: int
    sampling: _common_pb2.Sampling
    acceptance: _common_pb2.Acceptance
    feature_layers: _containers.RepeatedScalarFieldContainer[int]
    owner_tag: bytes
    plan_drafts: bool
    draft_method: str
    shadow_drafts: bool
    tree_nodes: int
    num_draft_tokens: int
    prefix_scope: str
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., context_tokens: _Optional[_Iterable[int]] = ..., prompt_len: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ..., acceptance: _Optional[_Union[_common_pb2.Acceptance, _Mapping]] = ..., feature_layers: _Optional[_Iterable[int]] = ..., owner_tag: _Optional[bytes] = ..., plan_drafts: _Optional[bool] = ..., draft_method: _Optional[str] = ..., shadow_drafts: _Optional[bool] = ..., tree_nodes: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., prefix_scope: _Optional[str] = ...) -> None: ...

class TargetFeatures(_message.Message):
    __slots__ = ("start", "shape", "dtype", "data")
    START_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, start: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class SparseDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class DraftBlock(_message.Message):
    __slots__ = ("session_id", "epoch", "round", "base_len", "tokens", "proposals", "draft_us", "decision_proposals", "assumes", "parents", "source", "survival", "predrafted")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BASE_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_US_FIELD_NUMBER: _ClassVar[int]
    DECISION_PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    ASSUMES_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SURVIVAL_FIELD_NUMBER: _ClassVar[int]
    PREDRAFTED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    round: int
    base_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    proposals: _containers.RepeatedCompositeFieldContainer[SparseDistribution]
    draft_us: int
    decision_proposals: _containers.RepeatedCompositeFieldContainer[SparseDistribution]
    assumes: Outcome
    parents: _containers.RepeatedScalarFieldContainer[int]
    source: str
    survival: _containers.RepeatedScalarFieldContainer[float]
    predrafted: bool
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., base_len: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., proposals: _Optional[_Iterable[_Union[SparseDistribution, _Mapping]]] = ..., draft_us: _Optional[int] = ..., decision_proposals: _Optional[_Iterable[_Union[SparseDistribution, _Mapping]]] = ..., assumes: _Optional[_Union[Outcome, _Mapping]] = ..., parents: _Optional[_Iterable[int]] = ..., source: _Optional[str] = ..., survival: _Optional[_Iterable[float]] = ..., predrafted: _Optional[bool] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("num_accepted", "next_token", "path")
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    num_accepted: int
    next_token: int
    path: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., path: _Optional[_Iterable[int]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("session_id", "epoch", "round", "is_stale", "tokens", "committed_len", "finish_reason", "features", "num_verified", "next_draft_tokens", "path", "logprobs", "prompt_logprobs", "catching_up", "stats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    IS_STALE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEN_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUM_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    NEXT_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CATCHING_UP_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    round: int
    is_stale: bool
    tokens: _containers.RepeatedScalarFieldContainer[int]
    committed_len: int
    finish_reason: _common_pb2.FinishReason
    features: TargetFeatures
    num_verified: int
    next_draft_tokens: int
    path: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    catching_up: bool
    stats: _common_pb2.RoundStats
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., is_stale: _Optional[bool] = ..., tokens: _Optional[_Iterable[int]] = ..., committed_len: _Optional[int] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., features: _Optional[_Union[TargetFeatures, _Mapping]] = ..., num_verified: _Optional[int] = ..., next_draft_tokens: _Optional[int] = ..., path: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., catching_up: _Optional[bool] = ..., stats: _Optional[_Union[_common_pb2.RoundStats, _Mapping]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: SessionOpen
    def __init__(self, session: _Optional[_Union[SessionOpen, _Mapping]] = ...) -> None: ...
