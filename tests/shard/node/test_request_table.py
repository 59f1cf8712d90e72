"""A request's life at stage 0 (`RequestTable`), with no NATS: a real engine core and scheduler,
stand-in messages, and the bus actions each operation returns checked as values."""

from __future__ import annotations

from typing import Any, cast

from nats.aio.msg import Msg

from mohawk_common.bus.requests import cancel_tag
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.engine.sequence import DEFAULT_QOS
from mohawk_shard.engine.sequence import Sequence as Seq
from mohawk_shard.node.bus_actions import Ack, Fail, Late, Nak
from mohawk_shard.node.held import Delivery
from mohawk_shard.node.request_table import RequestTable
from mohawk_shard.node.traces import StageTraces

KEY = b"k" * 32
PARAMS = SamplingParams.create(temperature=0.0, max_tokens=8)


class StandIn:
    """Stands in for a work-queue message: the table only hands it to the actions it returns."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StandIn({self.name})"


def make_table(max_resumes: int = 2) -> tuple[RequestTable, list[Seq]]:
    forgotten: list[Seq] = []
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    scheduler = Scheduler(config, BlockManager(64, 4))
    table = RequestTable(scheduler, 100, max_resumes, StageTraces.off(), on_forget=forgotten.append)
    return table, forgotten


def admit(table: RequestTable, request_id: str, **delivery: Any) -> Msg:
    msg = cast(Msg, StandIn(request_id))
    held = Delivery(msg, KEY, None, **delivery)
    table.admit(held, request_id, [1, 2, 3], PARAMS, [], DEFAULT_QOS)
    return msg


def token(table: RequestTable, request_id: str, token_id: int = 7, finish: str = "") -> bus_pb2.SampledResult:
    seq = table.core.request(request_id)
    assert seq is not None
    return bus_pb2.SampledResult(seq_id=seq.seq_id, token_id=token_id, finish_reason=finish)


def is_gone(table: RequestTable, request_id: str) -> bool:
    return table.core.request(request_id) is None and table.held.get(request_id) is None


def test_a_request_is_admitted_joins_a_step_and_is_acked_when_it_finishes() -> None:
    table, forgotten = make_table()
    msg = admit(table, "r1")
    batch = table.core.next_batch()
    assert batch is not None
    (joining,) = table.joining(batch).values()
    assert (joining.request_id, joining.token_key, list(joining.prompt_tail)) == ("r1", KEY, [1, 2, 3])
    assert table.apply([token(table, "r1")]) == []  # a token, not the last
    assert table.apply([token(table, "r1", finish="stop")]) == [Ack(msg)]
    assert is_gone(table, "r1") and [s.request_id for s in forgotten] == ["r1"]
    assert len(table.held) == 0


def test_a_failed_step_ends_each_of_its_requests_with_a_500_once() -> None:
    table, _ = make_table()
    msgs = [admit(table, "a"), admit(table, "b")]
    batch = table.core.next_batch()
    assert batch is not None
    actions = table.fail(batch, "internal error")
    assert actions == [Fail(m, r, "internal error", 500, None) for m, r in zip(msgs, "ab", strict=True)]
    assert is_gone(table, "a") and is_gone(table, "b")
    assert table.fail(batch, "internal error") == []  # nothing left to fail


def test_a_cancel_needs_the_requests_tag() -> None:
    table, _ = make_table()
    msg = admit(table, "r1")
    assert table.cancel("r1", b"forged") is None and table.core.request("r1") is not None
    assert table.cancel("r1", cancel_tag(KEY, "r1")) == [Ack(msg)]
    assert is_gone(table, "r1")
    assert table.cancel("r1", cancel_tag(KEY, "r1")) == []  # not held here (any more)


def test_an_expired_request_resumes_from_the_streams_tokens_until_it_makes_no_progress() -> None:
    table, _ = make_table(max_resumes=2)
    msg = admit(table, "r1")
    table.apply([token(table, "r1", 5)])
    for expiries in (1, 2):
        seq = table.core.request("r1")
        assert seq is not None
        resume, actions = table.expire(seq)
        assert resume is not None and resume.expiries == expiries and actions == []
        assert table.resume(resume, [5, 6], ended=False) == []
        again = table.core.request("r1")
        assert again is not None and again is not seq and again.output_token_ids == [5, 6]
    seq = table.core.request("r1")
    assert seq is not None
    resume, actions = table.expire(seq)  # the third expiry in a row with no token: it ends
    assert resume is None
    assert actions == [
        Fail(msg, "r1", "the pipeline gave no result for 2 steps in a row; retry the request", 503, None)
    ]
    assert is_gone(table, "r1")


def test_a_token_starts_the_expiry_count_again() -> None:
    table, _ = make_table(max_resumes=1)
    admit(table, "r1")
    seq = table.core.request("r1")
    assert seq is not None
    resume, _ = table.expire(seq)
    assert resume is not None
    table.resume(resume, [], ended=False)
    table.apply([token(table, "r1")])
    seq = table.core.request("r1")
    assert seq is not None
    resume, actions = table.expire(seq)
    assert resume is not None and resume.expiries == 1 and actions == []


def test_a_resume_finds_its_request_ended_or_cancelled_meanwhile() -> None:
    table, _ = make_table()
    msg = admit(table, "r1")
    seq = table.core.request("r1")
    assert seq is not None
    resume, _ = table.expire(seq)
    assert resume is not None
    assert table.resume(resume, [4, 5], ended=True) == [Ack(msg)]
    assert is_gone(table, "r1")
    admit(table, "r2")
    seq = table.core.request("r2")
    assert seq is not None
    resume, _ = table.expire(seq)
    assert resume is not None
    table.cancel("r2", cancel_tag(KEY, "r2"))  # cancelled while the token stream was read
    assert table.resume(resume, [], ended=False) == [] and is_gone(table, "r2")


def test_orphans_are_cancelled_and_a_late_one_gets_a_504() -> None:
    table, _ = make_table()
    gone = admit(table, "g", gateway="gw-1")
    late = admit(table, "l", gateway="gw-2", deadline=100.0)
    admit(table, "ok", gateway="gw-2", deadline=10_000.0)
    found = {rid: (why, actions) for rid, why, actions in table.orphans({"gw-1"}, now=1_000.0)}
    assert found == {
        "g": ("its gateway is gone", [Ack(gone)]),
        "l": ("its deadline passed", [Late(late, "l", None)]),
    }
    assert is_gone(table, "g") and is_gone(table, "l") and table.core.request("ok") is not None


def test_a_hand_back_naks_every_held_message_and_keeps_no_record() -> None:
    table, _ = make_table()
    msgs = [admit(table, "a"), admit(table, "b")]
    assert table.hand_back() == [Nak(m) for m in msgs]
    assert len(table.held) == 0


def test_a_newly_held_message_is_announced_so_the_heartbeat_lists_it_at_once() -> None:
    """The node sends its next heartbeat early when told (`on_hold`): the coordinator hands a dead
    stage 0's held messages back from that list, so it must not wait for the interval."""
    announced: list[int] = []
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    table = RequestTable(
        Scheduler(config, BlockManager(64, 4)), 100, 2, StageTraces.off(), on_hold=lambda: announced.append(1)
    )
    admit(table, "a")
    admit(table, "b")
    assert len(announced) == 2 and len(table.held) == 2


def test_a_resumed_request_records_the_time_to_its_next_token_once() -> None:
    table, _ = make_table()
    msg = cast(Msg, StandIn("r"))
    table.admit(Delivery(msg, KEY, None), "r", [1, 2, 3], PARAMS, [7, 7], DEFAULT_QOS)  # emitted 2 before
    seq = table.core.request("r")
    assert seq is not None and seq.resumed_at > 0
    assert table.apply([token(table, "r")]) == []
    assert table.resumes.num_hops == 1 and seq.resumed_at == 0.0
    table.apply([token(table, "r")])
    assert table.resumes.num_hops == 1  # only the first token after the resume counts


def test_a_redelivered_request_is_charged_only_what_the_stage_did_not_carry() -> None:
    """A request the stream redelivers after a re-plan asks the node's stage what of its history it
    carried (`Stage.num_carried`); a new one does not ask; the step-time fit counts only what was
    computed."""
    asked: list[tuple[str, int]] = []

    def carried(request_id: str, history_len: int) -> int:
        asked.append((request_id, history_len))
        return 99  # more than may be trusted: the core keeps the last position to compute

    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2, max_model_len=64)
    table = RequestTable(Scheduler(config, BlockManager(64, 4)), 100, 2, StageTraces.off(), carried=carried)
    msg = cast(Msg, StandIn("r"))
    table.admit(Delivery(msg, KEY, None), "resumed", [1, 2, 3], PARAMS, [4, 5], DEFAULT_QOS)
    table.admit(Delivery(msg, KEY, None), "new", [1, 2, 3], PARAMS, [], DEFAULT_QOS)
    assert asked == [("resumed", 5)]
    seq = table.core.request("resumed")
    assert seq is not None and seq.num_carried_tokens == 4
    batch = table.core.next_batch()
    assert batch is not None
    assert [(s.start_position, s.num_new_tokens) for s in batch.sequences] == [(0, 5), (0, 1)]
    assert [table.core._num_computed(s) for s in batch.sequences] == [1, 1]


def test_a_failovers_catch_up_is_one_step_then_micro_batches_again() -> None:
    """Requests resumed with a carry catch up in one step, whatever the micro-batch share; then
    the running set splits into micro-batches again."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    table = RequestTable(
        Scheduler(config, BlockManager(64, 4)), 100, 2, StageTraces.off(), carried=lambda key, n: n - 1
    )
    msg = cast(Msg, StandIn("r"))
    for i in range(4):
        table.admit(Delivery(msg, KEY, None), f"r{i}", [1, 2, 3], PARAMS, [4], DEFAULT_QOS)
    assert table.core.is_catching_up  # the head gathers the rest of the hand-back a moment
    batch = table.core.next_batch(num_groups=2)
    assert batch is not None and len(batch.sequences) == 4
    assert not table.core.is_catching_up
    for seq in list(table.core.scheduler.running):
        seq.append_token(7)
    again = table.core.next_batch(num_groups=2)
    assert again is not None and len(again.sequences) == 2
