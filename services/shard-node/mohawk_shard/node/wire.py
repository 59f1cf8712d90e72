"""Engine messages ↔ their protobuf form on the bus.

Hidden states ↔ bytes is each backend's `encode_hidden`/`decode_hidden`, not this module's: the
wire path imports no array library, so an MLX node never loads torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from mohawk_proto.v1 import bus_pb2, engine_pb2
from mohawk_shard.engine.kv_mirror import MirrorSpan
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Priority, QoS
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, StepBatch


class Joining(NamedTuple):
    """What a stage learns about a sequence that joins a step."""

    request_id: str
    prompt_tail: Sequence[int]
    token_key: bytes  # the token-event key ("" = events in plaintext)
    traceparent: str = ""  # the sending stage's span for this sequence ("" = not traced)


def sampling_to_proto(params: SamplingParams) -> engine_pb2.SamplingParams:
    message = engine_pb2.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_tokens=params.min_tokens,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )
    if params.seed is not None:
        message.seed = params.seed
    if params.max_tokens is not None:
        message.max_tokens = params.max_tokens
    if params.logprobs is not None:
        message.logprobs = params.logprobs
    return message


def sampling_from_proto(message: engine_pb2.SamplingParams) -> SamplingParams:
    """Validated parameters; raises InvalidRequestError on values the engine cannot honour."""
    kwargs: dict[str, object] = {
        "temperature": message.temperature,
        "top_p": message.top_p,
        "top_k": message.top_k,
        "min_tokens": message.min_tokens,
        "stop": tuple(message.stop),
        "stop_token_ids": tuple(message.stop_token_ids),
        "ignore_eos": message.ignore_eos,
        "presence_penalty": message.presence_penalty,
        "frequency_penalty": message.frequency_penalty,
    }
    for optional in ("seed", "max_tokens", "logprobs"):
        if message.HasField(optional):
            kwargs[optional] = getattr(message, optional)
    return SamplingParams.create(**kwargs)


_PRIORITIES = {
    bus_pb2.PRIORITY_HIGH: Priority.HIGH,
    bus_pb2.PRIORITY_NORMAL: Priority.NORMAL,
    bus_pb2.PRIORITY_LOW: Priority.LOW,
}


def qos_from_proto(request: bus_pb2.GenerateRequest) -> QoS:
    """The request's tenant, priority, weight and latency budget; raises InvalidRequestError on
    values the scheduler cannot honour (a priority this node does not know counts as normal)."""
    priority = _PRIORITIES.get(request.priority, Priority.NORMAL)
    return QoS.create(request.tenant, priority, request.weight, request.latency_budget_ms)


def step_batch_to_proto(
    batch: StepBatch, specs: Mapping[int, Joining], *, with_token_ids: bool
) -> engine_pb2.StepBatch:
    """`specs` maps seq_id → what the stages learn of each sequence that joins in this step."""
    message = engine_pb2.StepBatch(step_id=batch.step_id, finished_seq_ids=list(batch.freed_seq_ids))
    for step in batch.sequences:
        item = message.sequences.add(
            seq_id=step.seq_id,
            start_position=step.start_position,
            num_new_tokens=step.num_new_tokens,
            new_block_ids=list(step.new_block_ids),
            sample=step.sample,
        )
        if with_token_ids:
            item.token_ids.extend(step.token_ids)
        if step.new_sequence is not None:
            spec = step.new_sequence
            joining = specs[step.seq_id]
            item.new_sequence.CopyFrom(
                engine_pb2.SequenceSpec(
                    num_prompt_tokens=spec.num_prompt_tokens,
                    output_token_ids=list(spec.output_token_ids),
                    sampling=sampling_to_proto(spec.params),
                    request_id=joining.request_id,
                    prompt_tail=list(joining.prompt_tail),
                    token_key=joining.token_key,
                    num_cached_tokens=spec.num_cached_tokens,
                    latency_budget_ms=spec.latency_budget_ms,
                    traceparent=joining.traceparent,
                )
            )
    return message


def step_batch_from_proto(message: engine_pb2.StepBatch) -> tuple[StepBatch, dict[int, Joining]]:
    """The step, and what the stages learn of each sequence joining in it."""
    steps = []
    joining: dict[int, Joining] = {}
    for item in message.sequences:
        spec = None
        if item.HasField("new_sequence"):
            s = item.new_sequence
            params = sampling_from_proto(s.sampling)
            spec = SequenceSpec(
                s.num_prompt_tokens,
                params,
                tuple(s.output_token_ids),
                s.num_cached_tokens,
                s.latency_budget_ms,
                s.request_id,
            )
            joining[item.seq_id] = Joining(s.request_id, tuple(s.prompt_tail), s.token_key, s.traceparent)
        token_ids = tuple(item.token_ids) or (0,) * item.num_new_tokens
        steps.append(
            SequenceStep(
                item.seq_id, item.start_position, token_ids, tuple(item.new_block_ids), item.sample, spec
            )
        )
    return StepBatch(message.step_id, tuple(steps), tuple(message.finished_seq_ids)), joining


class EncodedMirror(NamedTuple):
    """A step's mirrored KV (`engine/kv_mirror.py`), its array encoded by the backend."""

    layers: tuple[int, int]
    spans: Sequence[MirrorSpan]
    encoded: tuple[str, list[int], bytes]  # dtype, shape, bytes


def write_mirror(into: engine_pb2.KvMirror, mirror: EncodedMirror) -> None:
    """Fill the frame's mirror field in place (its bytes are copied once, not built and copied)."""
    dtype, shape, data = mirror.encoded
    into.layer_start, into.layer_end = mirror.layers
    into.spans.extend(
        engine_pb2.MirroredSpan(seq_id=s.seq_id, from_position=s.from_position, num_positions=s.num_positions)
        for s in mirror.spans
    )
    into.dtype, into.data = dtype, data
    into.shape.extend(shape)


def mirror_spans(message: engine_pb2.KvMirror) -> tuple[MirrorSpan, ...]:
    return tuple(MirrorSpan(s.seq_id, s.from_position, s.num_positions) for s in message.spans)


def take_mirror(step: engine_pb2.StepBatch) -> engine_pb2.KvMirror | None:
    """The KV the stage before mirrored in `step`, cleared from it (it goes no further): the
    message taken out keeps its contents (protobuf detaches a cleared field's submessage), so its
    bytes are not copied."""
    if not step.HasField("mirror"):
        return None
    mirror = step.mirror
    step.ClearField("mirror")
    return mirror
