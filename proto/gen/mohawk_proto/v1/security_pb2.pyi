from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HybridSignature(_message.Message):
    __slots__ = ("ecdsa_p256", "mldsa65")
    ECDSA_P256_FIELD_NUMBER: _ClassVar[int]
    MLDSA65_FIELD_NUMBER: _ClassVar[int]
    ecdsa_p256: bytes
    mldsa65: bytes
    def __init__(self, ecdsa_p256: _Optional[bytes] = ..., mldsa65: _Optional[bytes] = ...) -> None: ...

class RootPublicKey(_message.Message):
    __slots__ = ("ecdsa_p256_public", "mldsa65_public")
    ECDSA_P256_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLDSA65_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    ecdsa_p256_public: bytes
    mldsa65_public: bytes
    def __init__(self, ecdsa_p256_public: _Optional[bytes] = ..., mldsa65_public: _Optional[bytes] = ...) -> None: ...

class CertificateBody(_message.Message):
    __slots__ = ("format", "serial", "node_id", "role", "ecdsa_p256_public", "mldsa65_public", "x25519_public", "mlkem768_public", "not_before", "not_after", "issuer", "model")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ECDSA_P256_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLDSA65_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    X25519_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLKEM768_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    format: int
    serial: int
    node_id: str
    role: str
    ecdsa_p256_public: bytes
    mldsa65_public: bytes
    x25519_public: bytes
    mlkem768_public: bytes
    not_before: float
    not_after: float
    issuer: bytes
    model: str
    def __init__(self, format: _Optional[int] = ..., serial: _Optional[int] = ..., node_id: _Optional[str] = ..., role: _Optional[str] = ..., ecdsa_p256_public: _Optional[bytes] = ..., mldsa65_public: _Optional[bytes] = ..., x25519_public: _Optional[bytes] = ..., mlkem768_public: _Optional[bytes] = ..., not_before: _Optional[float] = ..., not_after: _Optional[float] = ..., issuer: _Optional[bytes] = ..., model: _Optional[str] = ...) -> None: ...

class Certificate(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: HybridSignature
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class PrivateKeyBundle(_message.Message):
    __slots__ = ("ecdsa_p256_private", "mldsa65_seed", "x25519_private", "mlkem768_seed")
    ECDSA_P256_PRIVATE_FIELD_NUMBER: _ClassVar[int]
    MLDSA65_SEED_FIELD_NUMBER: _ClassVar[int]
    X25519_PRIVATE_FIELD_NUMBER: _ClassVar[int]
    MLKEM768_SEED_FIELD_NUMBER: _ClassVar[int]
    ecdsa_p256_private: bytes
    mldsa65_seed: bytes
    x25519_private: bytes
    mlkem768_seed: bytes
    def __init__(self, ecdsa_p256_private: _Optional[bytes] = ..., mldsa65_seed: _Optional[bytes] = ..., x25519_private: _Optional[bytes] = ..., mlkem768_seed: _Optional[bytes] = ...) -> None: ...

class RevocationListBody(_message.Message):
    __slots__ = ("number", "serials", "issued_at", "issuer")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    SERIALS_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    number: int
    serials: _containers.RepeatedScalarFieldContainer[int]
    issued_at: float
    issuer: bytes
    def __init__(self, number: _Optional[int] = ..., serials: _Optional[_Iterable[int]] = ..., issued_at: _Optional[float] = ..., issuer: _Optional[bytes] = ...) -> None: ...

class RevocationList(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: HybridSignature
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class HandshakeInit(_message.Message):
    __slots__ = ("version", "suites", "channel_id", "plan_version", "certificate", "x25519_public", "mlkem768_public", "responder_id", "sent_at", "signature")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SUITES_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    X25519_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLKEM768_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    version: int
    suites: _containers.RepeatedScalarFieldContainer[str]
    channel_id: bytes
    plan_version: int
    certificate: Certificate
    x25519_public: bytes
    mlkem768_public: bytes
    responder_id: str
    sent_at: float
    signature: HybridSignature
    def __init__(self, version: _Optional[int] = ..., suites: _Optional[_Iterable[str]] = ..., channel_id: _Optional[bytes] = ..., plan_version: _Optional[int] = ..., certificate: _Optional[_Union[Certificate, _Mapping]] = ..., x25519_public: _Optional[bytes] = ..., mlkem768_public: _Optional[bytes] = ..., responder_id: _Optional[str] = ..., sent_at: _Optional[float] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("suite", "certificate", "x25519_public", "mlkem768_ciphertext", "signature")
    SUITE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    X25519_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLKEM768_CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    suite: str
    certificate: Certificate
    x25519_public: bytes
    mlkem768_ciphertext: bytes
    signature: HybridSignature
    def __init__(self, suite: _Optional[str] = ..., certificate: _Optional[_Union[Certificate, _Mapping]] = ..., x25519_public: _Optional[bytes] = ..., mlkem768_ciphertext: _Optional[bytes] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class HandshakeFinish(_message.Message):
    __slots__ = ("channel_id", "signature")
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    channel_id: bytes
    signature: HybridSignature
    def __init__(self, channel_id: _Optional[bytes] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class HandshakeReply(_message.Message):
    __slots__ = ("message", "refused", "certificate", "signature")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    refused: bool
    certificate: Certificate
    signature: HybridSignature
    def __init__(self, message: _Optional[bytes] = ..., refused: _Optional[bool] = ..., certificate: _Optional[_Union[Certificate, _Mapping]] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class SealedEnvelope(_message.Message):
    __slots__ = ("version", "recipient_serial", "x25519_public", "mlkem768_ciphertext", "nonce", "ciphertext")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_SERIAL_FIELD_NUMBER: _ClassVar[int]
    X25519_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MLKEM768_CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    version: int
    recipient_serial: int
    x25519_public: bytes
    mlkem768_ciphertext: bytes
    nonce: bytes
    ciphertext: bytes
    def __init__(self, version: _Optional[int] = ..., recipient_serial: _Optional[int] = ..., x25519_public: _Optional[bytes] = ..., mlkem768_ciphertext: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class SealedRequest(_message.Message):
    __slots__ = ("request_id", "model", "sender", "envelope", "signature")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    sender: Certificate
    envelope: SealedEnvelope
    signature: HybridSignature
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., sender: _Optional[_Union[Certificate, _Mapping]] = ..., envelope: _Optional[_Union[SealedEnvelope, _Mapping]] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...

class SealedEvent(_message.Message):
    __slots__ = ("nonce", "ciphertext")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    ciphertext: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class FrameHeader(_message.Message):
    __slots__ = ("channel_id", "seq", "key_epoch", "plan_version", "stage", "step_id", "dtype", "shape", "chunk_index", "num_chunks", "sent_at", "kind")
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KEY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    channel_id: bytes
    seq: int
    key_epoch: int
    plan_version: int
    stage: int
    step_id: int
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    chunk_index: int
    num_chunks: int
    sent_at: float
    kind: int
    def __init__(self, channel_id: _Optional[bytes] = ..., seq: _Optional[int] = ..., key_epoch: _Optional[int] = ..., plan_version: _Optional[int] = ..., stage: _Optional[int] = ..., step_id: _Optional[int] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., chunk_index: _Optional[int] = ..., num_chunks: _Optional[int] = ..., sent_at: _Optional[float] = ..., kind: _Optional[int] = ...) -> None: ...

class SealKeyRecordBody(_message.Message):
    __slots__ = ("format", "number", "model", "certificate", "copies", "issued_at", "issuer")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    format: int
    number: int
    model: str
    certificate: Certificate
    copies: _containers.RepeatedCompositeFieldContainer[SealedEnvelope]
    issued_at: float
    issuer: bytes
    def __init__(self, format: _Optional[int] = ..., number: _Optional[int] = ..., model: _Optional[str] = ..., certificate: _Optional[_Union[Certificate, _Mapping]] = ..., copies: _Optional[_Iterable[_Union[SealedEnvelope, _Mapping]]] = ..., issued_at: _Optional[float] = ..., issuer: _Optional[bytes] = ...) -> None: ...

class SealKeyRecord(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: HybridSignature
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[_Union[HybridSignature, _Mapping]] = ...) -> None: ...
