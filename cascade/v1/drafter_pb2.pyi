from cascade.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunSessionRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "context_tokens", "prompt_len", "sampling", "draft", "verifier_address", "acceptance", "owner_tag", "memory_scope", "prefix_scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_TAG_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SCOPE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    context_tokens: _containers.RepeatedScalarFieldContainer[int]
    prompt_len: int
    sampling: _common_pb2.Sampling
    draft: _common_pb2.DraftSettings
    verifier_address: str
    acceptance: _common_pb2.Acceptance
    owner_tag: bytes
    memory_scope: str
    prefix_scope: str
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., context_tokens: _Optional[_Iterable[int]] = ..., prompt_len: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.Sampling, _Mapping]] = ..., draft: _Optional[_Union[_common_pb2.DraftSettings, _Mapping]] = ..., verifier_address: _Optional[str] = ..., acceptance: _Optional[_Union[_common_pb2.Acceptance, _Mapping]] = ..., owner_tag: _Optional[bytes] = ..., memory_scope: _Optional[str] = ..., prefix_scope: _Optional[str] = ...) -> None: ...
