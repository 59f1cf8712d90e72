"""Scheduler: continuous batching, decode first, chunked prefill, admission and preemption (CPU only)."""

from __future__ import annotations

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.engine.sequence import Sequence, SequenceStatus


def make(num_blocks: int = 16, block_size: int = 4, budget: int = 64, max_seqs: int = 8) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=256)
    return Scheduler(config, BlockManager(num_blocks, block_size))


def seq(seq_id: int, length: int, base: int = 0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", [base + seq_id * 1000 + i for i in range(length)], SamplingParams())


def sample_all(scheduler: Scheduler, token: int = 7) -> None:
    """What the engine does after a step: each sequence whose chunk reached its end gets a token."""
    for s in scheduler.running:
        if s.num_uncomputed_tokens == 0:
            s.append_token(token)


def test_prefill_then_decode_with_exact_blocks() -> None:
    sch = make()
    a, b = seq(0, 6), seq(1, 3)
    sch.add(a)
    sch.add(b)
    out = sch.schedule()
    assert [
        (s.seq.seq_id, s.start_position, s.num_new_tokens, s.new_block_ids, s.sample) for s in out.scheduled
    ] == [
        (0, 0, 6, [0, 1], True),
        (1, 0, 3, [2], True),
    ]
    sample_all(sch)
    out = sch.schedule()
    assert [(s.seq.seq_id, s.start_position, s.num_new_tokens, s.new_block_ids) for s in out.scheduled] == [
        (0, 6, 1, []),
        (1, 3, 1, []),
    ]
    assert all(not s.is_new for s in out.scheduled)


def test_nothing_scheduled_while_waiting_for_sampled_token() -> None:
    sch = make()
    sch.add(seq(0, 5))
    assert sch.schedule().num_batched_tokens == 5
    assert sch.schedule().scheduled == []


def test_chunked_prefill_under_budget_and_decode_goes_first() -> None:
    sch = make(num_blocks=32, budget=8)
    short = seq(0, 3)
    sch.add(short)
    sch.schedule()
    sample_all(sch)
    long = seq(1, 20)
    sch.add(long)
    out = sch.schedule()
    assert [(s.seq.seq_id, s.start_position, s.num_new_tokens, s.sample) for s in out.scheduled] == [
        (0, 3, 1, True),
        (1, 0, 7, False),
    ]
    sample_all(sch)
    out = sch.schedule()
    assert [(s.seq.seq_id, s.start_position, s.num_new_tokens, s.sample) for s in out.scheduled] == [
        (0, 4, 1, True),
        (1, 7, 7, False),
    ]
    sample_all(sch)
    out = sch.schedule()
    assert [(s.seq.seq_id, s.start_position, s.num_new_tokens, s.sample) for s in out.scheduled] == [
        (0, 5, 1, True),
        (1, 14, 6, True),
    ]


def test_admission_bounded_by_free_blocks_and_max_seqs() -> None:
    sch = make(num_blocks=4, block_size=4, max_seqs=8)
    for i in range(3):
        sch.add(seq(i, 8))  # each needs 2 blocks
    out = sch.schedule()
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1]
    assert [s.seq_id for s in sch.waiting] == [2]
    sch2 = make(num_blocks=64, max_seqs=2)
    for i in range(3):
        sch2.add(seq(i, 2))
    assert [s.seq.seq_id for s in sch2.schedule().scheduled] == [0, 1]


def test_preemption_by_recompute_frees_newest_and_requeues_it_first() -> None:
    sch = make(num_blocks=4, block_size=4)
    a, b = seq(0, 4), seq(1, 4)
    sch.add(a)
    sch.add(b)
    sch.schedule()  # a: [0], b: [1]
    for _ in range(4):
        sample_all(sch)
        sch.schedule()  # each grows into a second block: a [0,2], b [1,3], 8 tokens computed
    sample_all(sch)  # both need a third block; none free
    out = sch.schedule()
    assert [(s.seq.seq_id, s.new_block_ids) for s in out.scheduled] == [(0, [3])]
    assert out.freed_seq_ids == [1]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_ids == []
    assert list(sch.waiting) == [b] and b.num_preemptions == 1
    sch.finish(a)
    out = sch.schedule()
    (again,) = out.scheduled
    assert again.seq is b and again.is_new
    # prompt + the 5 tokens it had produced are recomputed at once, less its first block, which
    # kept its prefix-cache hash while free and is shared back
    assert (again.start_position, again.num_new_tokens, again.new_block_ids[0]) == (4, 5, 1)
    assert out.freed_seq_ids == [0]


def test_finish_frees_blocks_immediately_and_reports_to_stages() -> None:
    sch = make(num_blocks=8)
    a = seq(0, 10)
    sch.add(a)
    sch.schedule()
    assert sch.block_manager.num_free_blocks == 5
    sch.finish(a)
    assert sch.block_manager.num_free_blocks == 8
    assert sch.num_unfinished == 0
    assert sch.schedule().freed_seq_ids == [0]


def test_cancel_while_waiting_never_reaches_stages() -> None:
    sch = make(num_blocks=2)
    a, b = seq(0, 8), seq(1, 8)
    sch.add(a)
    sch.add(b)
    sch.schedule()
    sch.finish(b)
    assert list(sch.waiting) == [] and sch.schedule().freed_seq_ids == []


def test_shared_prefix_is_computed_once() -> None:
    sch = make(num_blocks=16, block_size=4)
    prompt = list(range(500, 512))
    a = Sequence(0, "a", list(prompt), SamplingParams())
    sch.add(a)
    sch.schedule()
    b = Sequence(1, "b", [*prompt, 1, 2], SamplingParams())
    sch.add(b)
    (sb,) = sch.schedule().scheduled
    assert sb.start_position == 12 and sb.token_ids == [1, 2]
    assert b.block_ids[:3] == a.block_ids[:3] and b.num_cached_tokens == 12


def test_micro_batches_in_a_pipeline_take_turns() -> None:
    """Two steps in flight: a sequence awaiting its token sits out; max_seqs splits the running set."""
    sch = make(budget=64, max_seqs=8)
    seqs = [seq(i, 3) for i in range(4)]
    for s in seqs:
        sch.add(s)
    first = sch.schedule(max_seqs=2)
    assert [s.seq.seq_id for s in first.scheduled] == [0, 1]
    second = sch.schedule(max_seqs=2)  # the first step is still in flight
    assert [s.seq.seq_id for s in second.scheduled] == [2, 3]
    assert sch.schedule(max_seqs=2).is_empty  # everyone awaits a token
    seqs[0].append_token(7)
    seqs[1].append_token(7)
    assert [s.seq.seq_id for s in sch.schedule(max_seqs=2).scheduled] == [0, 1]


def test_a_sequence_awaiting_its_token_is_never_preempted() -> None:
    sch = make(num_blocks=3, block_size=4, budget=64, max_seqs=8)
    a, b = seq(0, 4), seq(1, 4)
    sch.add(a)
    sch.add(b)
    sch.schedule()  # both fill one block each; their tokens are in flight
    a.append_token(7)  # a's token came back; b's has not
    out = sch.schedule()  # a needs a new block: 1 free, fine
    assert [s.seq.seq_id for s in out.scheduled] == [0]
    for _ in range(4):
        a.append_token(7)
    a.num_computed_tokens = a.num_tokens - 1  # 8 computed: its next token opens a third block
    out = sch.schedule()  # a needs a third block: none free; b awaits its token, so a preempts itself
    assert out.scheduled == [] and b.status is SequenceStatus.RUNNING and a.status is SequenceStatus.WAITING


def test_admission_room_is_the_free_slots_in_bursts_then_a_fair_share_queue() -> None:
    sch = make(max_seqs=4)
    assert sch.num_admittable(max_waiting=64) == 4  # slots decide
    assert sch.num_admittable(max_waiting=64, burst=2) == 2  # a burst at a time
    sch.add(seq(0, 3))
    assert sch.num_admittable(max_waiting=64, burst=2) == 1
    sch.schedule()  # seq 0 runs; the queue is empty again
    assert sch.num_admittable(max_waiting=64, burst=2) == 2
    for i in range(1, 4):
        sch.add(seq(i, 3))
    # every slot is taken: a queue of up to max_waiting, a burst at a time
    assert sch.num_admittable(max_waiting=64, burst=8) == 8
    assert sch.num_admittable(max_waiting=5, burst=8) == 2
    for i in range(4, 6):
        sch.add(seq(i, 3))
    assert sch.num_admittable(max_waiting=5) == 0
    assert not sch.can_admit(max_waiting=5)


def test_resumed_requests_waiting_do_not_use_up_the_burst() -> None:
    """Requests a re-plan handed back were taken in already: all of them are pulled back at once
    (the burst paces new work), so a resume runs in as few steps as the chunk budget allows."""
    sch = make(max_seqs=8)
    for i in range(3):
        resumed = seq(i, 3)
        resumed.resumed_at = 1.0
        sch.add(resumed)
    assert sch.num_admittable(max_waiting=64, burst=2) == 2  # slots left: 5; the burst: 2, none new
    sch.add(seq(3, 3))
    assert sch.num_admittable(max_waiting=64, burst=2) == 1
    sch.schedule()  # every one runs: the queue is empty again
    assert sch.waiting.num_new == 0 and len(sch.waiting) == 0


def test_no_admission_while_the_kv_pool_has_no_block_per_running_sequence() -> None:
    sch = make(num_blocks=3, block_size=4, max_seqs=8)
    sch.add(seq(0, 4))
    sch.add(seq(1, 4))
    sch.schedule()  # two running sequences hold two blocks, one block left
    assert sch.block_manager.num_free_blocks == 1
    assert sch.num_admittable(max_waiting=64) == 0
    sch.finish(sch.running[0])
    assert sch.num_admittable(max_waiting=64) > 0


def test_a_resume_whose_kv_stage_0_carried_goes_in_one_chunk_charged_what_is_computed() -> None:
    """Positions stage 0 carried over a re-plan cost the budget nothing: four resumed histories of
    20 tokens under a budget of 8 go in one step, charged their last positions, beside a new
    request's chunk; without a carry they would take ten steps."""
    sch = make(num_blocks=64, budget=8)
    resumed = [seq(i, 20) for i in range(4)]
    for s in resumed:
        s.num_carried_tokens = 19
        sch.add(s)
    fresh = seq(9, 10)
    sch.add(fresh)
    out = sch.schedule()
    got = [(s.seq.seq_id, s.start_position, s.num_new_tokens, s.sample) for s in out.scheduled]
    assert got == [(0, 0, 20, True), (1, 0, 20, True), (2, 0, 20, True), (3, 0, 20, True), (9, 0, 4, False)]
    # a preempted one lost its carry (its KV here is freed): it is charged every position again
    victim = resumed[0]
    sch._preempt(victim)
    assert victim.num_carried_tokens == 0
    uncarried = make(num_blocks=64, budget=8)
    plain = seq(0, 20)
    uncarried.add(plain)
    assert uncarried.schedule().num_batched_tokens == 8
