"""The generated wire messages import from the installed package and survive a round trip."""

from __future__ import annotations

from mohawk_proto.v1 import engine_pb2 as pb


def make_batch() -> pb.StepBatch:
    sampling = pb.SamplingParams(temperature=0.5, top_p=0.9, top_k=40, seed=7, stop=["\n\n"], logprobs=2)
    first = pb.SequenceStep(
        seq_id=1,
        start_position=0,
        num_new_tokens=3,
        token_ids=[10, 11, 12],
        new_block_ids=[4],
        sample=True,
        new_sequence=pb.SequenceSpec(num_prompt_tokens=3, sampling=sampling),
    )
    second = pb.SequenceStep(seq_id=2, start_position=17, num_new_tokens=1, token_ids=[99], sample=True)
    return pb.StepBatch(step_id=42, sequences=[first, second], finished_seq_ids=[5, 6])


def test_step_batch_round_trip() -> None:
    batch = make_batch()
    decoded = pb.StepBatch.FromString(batch.SerializeToString())
    assert decoded == batch
    assert decoded.step_id == 42
    assert [s.seq_id for s in decoded.sequences] == [1, 2]
    assert list(decoded.sequences[0].token_ids) == [10, 11, 12]
    assert list(decoded.finished_seq_ids) == [5, 6]


def test_presence_of_optional_fields_survives() -> None:
    decoded = pb.StepBatch.FromString(make_batch().SerializeToString())
    first, second = decoded.sequences
    assert first.HasField("new_sequence") and not second.HasField("new_sequence")
    sampling = first.new_sequence.sampling
    assert sampling.HasField("seed") and sampling.seed == 7
    assert not sampling.HasField("max_tokens")
    assert sampling.HasField("logprobs") and sampling.logprobs == 2
    assert list(sampling.stop) == ["\n\n"]


def test_sampled_token_and_token_event_round_trip() -> None:
    token = pb.SampledToken(
        seq_id=1, token_id=5, logprob=-0.25, top_logprobs=[pb.TopLogprob(token_id=5, logprob=-0.25)]
    )
    assert pb.SampledToken.FromString(token.SerializeToString()) == token
    event = pb.TokenEvent(
        request_id="req-1",
        index=3,
        token_id=5,
        text=" hi",
        finish_reason="stop",
        usage=pb.Usage(prompt_tokens=4, completion_tokens=4, total_tokens=8),
    )
    assert pb.TokenEvent.FromString(event.SerializeToString()) == event
    assert not pb.SampledToken(seq_id=1, token_id=5).HasField("logprob")
