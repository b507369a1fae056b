from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_TARGET: _ClassVar[WorkerRole]
    WORKER_ROLE_DRAFT: _ClassVar[WorkerRole]

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_LOADING: _ClassVar[WorkerState]
    WORKER_STATE_SERVING: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_TARGET: WorkerRole
WORKER_ROLE_DRAFT: WorkerRole
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_LOADING: WorkerState
WORKER_STATE_SERVING: WorkerState
WORKER_STATE_DRAINING: WorkerState

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("role", "model_id", "tokenizer_hash", "vocab_size", "max_len", "kv_capacity_tokens", "kv_capacity_bytes", "num_slots", "k", "fanout", "data_address", "protocol_version", "state", "active_sequences", "pid", "version", "prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "preemptions")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_HASH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    FANOUT_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    role: WorkerRole
    model_id: str
    tokenizer_hash: str
    vocab_size: int
    max_len: int
    kv_capacity_tokens: int
    kv_capacity_bytes: int
    num_slots: int
    k: int
    fanout: _containers.RepeatedScalarFieldContainer[int]
    data_address: str
    protocol_version: int
    state: WorkerState
    active_sequences: int
    pid: int
    version: str
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    preemptions: int
    def __init__(self, role: _Optional[_Union[WorkerRole, str]] = ..., model_id: _Optional[str] = ..., tokenizer_hash: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_len: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ..., kv_capacity_bytes: _Optional[int] = ..., num_slots: _Optional[int] = ..., k: _Optional[int] = ..., fanout: _Optional[_Iterable[int]] = ..., data_address: _Optional[str] = ..., protocol_version: _Optional[int] = ..., state: _Optional[_Union[WorkerState, str]] = ..., active_sequences: _Optional[int] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., prefix_cache_queried_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., preemptions: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("grace_seconds",)
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    grace_seconds: int
    def __init__(self, grace_seconds: _Optional[int] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("active_sequences",)
    ACTIVE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    active_sequences: int
    def __init__(self, active_sequences: _Optional[int] = ...) -> None: ...
