from mohawk_proto.v1 import engine_pb2 as _engine_pb2
from mohawk_proto.v1 import security_pb2 as _security_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]
PRIORITY_NORMAL: Priority
PRIORITY_HIGH: Priority
PRIORITY_LOW: Priority

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "prompt_token_ids", "sampling", "created", "token_key", "gateway", "deadline", "tenant", "priority", "weight", "latency_budget_ms", "traceparent")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_KEY_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _engine_pb2.SamplingParams
    created: float
    token_key: bytes
    gateway: str
    deadline: float
    tenant: str
    priority: Priority
    weight: float
    latency_budget_ms: float
    traceparent: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_engine_pb2.SamplingParams, _Mapping]] = ..., created: _Optional[float] = ..., token_key: _Optional[bytes] = ..., gateway: _Optional[str] = ..., deadline: _Optional[float] = ..., tenant: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., weight: _Optional[float] = ..., latency_budget_ms: _Optional[float] = ..., traceparent: _Optional[str] = ...) -> None: ...

class SampledResult(_message.Message):
    __slots__ = ("seq_id", "token_id", "finish_reason")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    token_id: int
    finish_reason: str
    def __init__(self, seq_id: _Optional[int] = ..., token_id: _Optional[int] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("plan_version", "step_id", "results", "sent_at", "error")
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    plan_version: int
    step_id: int
    results: _containers.RepeatedCompositeFieldContainer[SampledResult]
    sent_at: float
    error: str
    def __init__(self, plan_version: _Optional[int] = ..., step_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[SampledResult, _Mapping]]] = ..., sent_at: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("node_id", "model", "backend", "device", "total_memory_bytes", "free_memory_bytes", "memory_limit_bytes", "kv_cache_bytes", "seconds_per_layer", "plan_version", "stage", "loaded", "sent_at", "started_at_ms", "kv_block_bytes_per_layer", "role", "hop_ms_p50", "hop_ms_p99", "num_hops", "security_rejections", "insecure", "held_layer_start", "held_layer_end", "model_id", "num_layers", "hidden_size", "vocab_size", "num_kv_heads", "head_dim", "max_position_embeddings", "layer_weight_bytes", "embedding_weight_bytes", "head_weight_bytes", "weights_format", "failed_steps", "expired_steps", "held_requests", "signed", "layer_windows", "sequence", "standby_layer_start", "standby_layer_end")
    class SecurityRejectionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_BYTES_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOP_MS_P50_FIELD_NUMBER: _ClassVar[int]
    HOP_MS_P99_FIELD_NUMBER: _ClassVar[int]
    NUM_HOPS_FIELD_NUMBER: _ClassVar[int]
    SECURITY_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    HELD_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    HELD_LAYER_END_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    LAYER_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FORMAT_FIELD_NUMBER: _ClassVar[int]
    FAILED_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_STEPS_FIELD_NUMBER: _ClassVar[int]
    HELD_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    LAYER_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STANDBY_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    STANDBY_LAYER_END_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    model: str
    backend: str
    device: str
    total_memory_bytes: int
    free_memory_bytes: int
    memory_limit_bytes: int
    kv_cache_bytes: int
    seconds_per_layer: float
    plan_version: int
    stage: int
    loaded: bool
    sent_at: float
    started_at_ms: int
    kv_block_bytes_per_layer: int
    role: str
    hop_ms_p50: float
    hop_ms_p99: float
    num_hops: int
    security_rejections: _containers.ScalarMap[str, int]
    insecure: bool
    held_layer_start: int
    held_layer_end: int
    model_id: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    layer_weight_bytes: int
    embedding_weight_bytes: int
    head_weight_bytes: int
    weights_format: str
    failed_steps: int
    expired_steps: int
    held_requests: _containers.RepeatedScalarFieldContainer[str]
    signed: ControlSignature
    layer_windows: _containers.RepeatedScalarFieldContainer[int]
    sequence: int
    standby_layer_start: int
    standby_layer_end: int
    def __init__(self, node_id: _Optional[str] = ..., model: _Optional[str] = ..., backend: _Optional[str] = ..., device: _Optional[str] = ..., total_memory_bytes: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., seconds_per_layer: _Optional[float] = ..., plan_version: _Optional[int] = ..., stage: _Optional[int] = ..., loaded: _Optional[bool] = ..., sent_at: _Optional[float] = ..., started_at_ms: _Optional[int] = ..., kv_block_bytes_per_layer: _Optional[int] = ..., role: _Optional[str] = ..., hop_ms_p50: _Optional[float] = ..., hop_ms_p99: _Optional[float] = ..., num_hops: _Optional[int] = ..., security_rejections: _Optional[_Mapping[str, int]] = ..., insecure: _Optional[bool] = ..., held_layer_start: _Optional[int] = ..., held_layer_end: _Optional[int] = ..., model_id: _Optional[str] = ..., num_layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., max_position_embeddings: _Optional[int] = ..., layer_weight_bytes: _Optional[int] = ..., embedding_weight_bytes: _Optional[int] = ..., head_weight_bytes: _Optional[int] = ..., weights_format: _Optional[str] = ..., failed_steps: _Optional[int] = ..., expired_steps: _Optional[int] = ..., held_requests: _Optional[_Iterable[str]] = ..., signed: _Optional[_Union[ControlSignature, _Mapping]] = ..., layer_windows: _Optional[_Iterable[int]] = ..., sequence: _Optional[int] = ..., standby_layer_start: _Optional[int] = ..., standby_layer_end: _Optional[int] = ...) -> None: ...

class PlanStage(_message.Message):
    __slots__ = ("node_id", "start", "end", "pipeline", "node_started_at_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    NODE_STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    start: int
    end: int
    pipeline: int
    node_started_at_ms: int
    def __init__(self, node_id: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., pipeline: _Optional[int] = ..., node_started_at_ms: _Optional[int] = ...) -> None: ...

class PlanStandby(_message.Message):
    __slots__ = ("node_id", "start", "end", "node_started_at_ms", "covers", "pipeline")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    NODE_STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    COVERS_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    start: int
    end: int
    node_started_at_ms: int
    covers: str
    pipeline: int
    def __init__(self, node_id: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., node_started_at_ms: _Optional[int] = ..., covers: _Optional[str] = ..., pipeline: _Optional[int] = ...) -> None: ...

class PlanPipeline(_message.Message):
    __slots__ = ("id", "epoch", "active", "num_kv_blocks", "max_model_len")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    id: int
    epoch: int
    active: bool
    num_kv_blocks: int
    max_model_len: int
    def __init__(self, id: _Optional[int] = ..., epoch: _Optional[int] = ..., active: _Optional[bool] = ..., num_kv_blocks: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("version", "model", "model_id", "num_layers", "stages", "num_kv_blocks", "block_size", "max_model_len", "state", "leader", "created", "reasons", "quarantined", "pipelines", "spares", "signed", "standbys")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    STANDBYS_FIELD_NUMBER: _ClassVar[int]
    version: int
    model: str
    model_id: str
    num_layers: int
    stages: _containers.RepeatedCompositeFieldContainer[PlanStage]
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    state: str
    leader: str
    created: float
    reasons: _containers.RepeatedScalarFieldContainer[str]
    quarantined: _containers.RepeatedScalarFieldContainer[str]
    pipelines: _containers.RepeatedCompositeFieldContainer[PlanPipeline]
    spares: _containers.RepeatedScalarFieldContainer[str]
    signed: ControlSignature
    standbys: _containers.RepeatedCompositeFieldContainer[PlanStandby]
    def __init__(self, version: _Optional[int] = ..., model: _Optional[str] = ..., model_id: _Optional[str] = ..., num_layers: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[PlanStage, _Mapping]]] = ..., num_kv_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., state: _Optional[str] = ..., leader: _Optional[str] = ..., created: _Optional[float] = ..., reasons: _Optional[_Iterable[str]] = ..., quarantined: _Optional[_Iterable[str]] = ..., pipelines: _Optional[_Iterable[_Union[PlanPipeline, _Mapping]]] = ..., spares: _Optional[_Iterable[str]] = ..., signed: _Optional[_Union[ControlSignature, _Mapping]] = ..., standbys: _Optional[_Iterable[_Union[PlanStandby, _Mapping]]] = ...) -> None: ...

class GatewayPresence(_message.Message):
    __slots__ = ("gateway_id", "instance", "pid", "at_ms", "signed")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    instance: str
    pid: int
    at_ms: int
    signed: ControlSignature
    def __init__(self, gateway_id: _Optional[str] = ..., instance: _Optional[str] = ..., pid: _Optional[int] = ..., at_ms: _Optional[int] = ..., signed: _Optional[_Union[ControlSignature, _Mapping]] = ...) -> None: ...

class TelemetryReport(_message.Message):
    __slots__ = ("kind", "sender", "body", "signed")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    sender: str
    body: str
    signed: ControlSignature
    def __init__(self, kind: _Optional[str] = ..., sender: _Optional[str] = ..., body: _Optional[str] = ..., signed: _Optional[_Union[ControlSignature, _Mapping]] = ...) -> None: ...

class ControlSignature(_message.Message):
    __slots__ = ("signer", "signature")
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    signer: _security_pb2.Certificate
    signature: _security_pb2.HybridSignature
    def __init__(self, signer: _Optional[_Union[_security_pb2.Certificate, _Mapping]] = ..., signature: _Optional[_Union[_security_pb2.HybridSignature, _Mapping]] = ...) -> None: ...
