"""The scheduler shares stage 0 between tenants: admission and decode selection by weight and priority."""

from __future__ import annotations

from collections import Counter

from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from mohawk_shard.engine.sequence import Priority, QoS, Sequence


def make(max_seqs: int = 4, num_blocks: int = 1024, budget: int = 512) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=512)
    return Scheduler(config, BlockManager(num_blocks, block_size=4))


def request(seq_id: int, tenant: str, weight: float = 1.0, priority: Priority = Priority.NORMAL) -> Sequence:
    prompt = [seq_id % 1000 * 10 + i for i in range(4)]
    return Sequence(seq_id, f"r{seq_id}", prompt, SamplingParams(), qos=QoS(tenant, priority, weight))


def step(sch: Scheduler, max_seqs: int | None = None, max_output: int = 8) -> SchedulerOutput:
    """One in-process step: schedule, sample a token for each sequence that reached its end, finish
    the ones with `max_output` tokens."""
    out = sch.schedule(max_seqs=max_seqs)
    for s in out.scheduled:
        if s.sample:
            s.seq.append_token(7)
            if s.seq.num_output_tokens >= max_output:
                sch.finish(s.seq)
    return out


def test_a_heavy_tenant_cannot_starve_a_light_one() -> None:
    sch = make(max_seqs=4)
    for i in range(60):
        sch.add(request(i, "heavy", weight=3.0))  # all of heavy's arrive first
    for i in range(60):
        sch.add(request(1000 + i, "light", weight=1.0))
    tokens: Counter[str] = Counter()
    first_light = None
    for n in range(120):
        out = step(sch)
        for s in out.scheduled:
            tokens[s.seq.qos.tenant] += s.num_new_tokens
            if first_light is None and s.seq.qos.tenant == "light":
                first_light = n
    assert {s.qos.tenant for s in sch.waiting} == {"heavy", "light"}  # both busy throughout
    assert first_light == 0  # admitted in the very first step, ahead of 59 queued heavy requests
    assert abs(tokens["heavy"] / tokens["light"] - 3.0) < 0.3


def test_fair_order_applies_to_what_the_head_has_pulled() -> None:
    """The bus head pulls what `num_admittable` allows on two consumers (its route's and the shared
    one), so it may hold more than it admits: the fair order, not the stream's, picks among those."""
    sch = make(max_seqs=4)
    stream = [request(i, "heavy") for i in range(6)] + [request(1000 + i, "light") for i in range(2)]
    stream += [request(100 + i, "heavy") for i in range(30)]
    admitted: list[str] = []
    while len(admitted) < 12:
        room = sch.num_admittable(max_waiting=8, burst=8)
        for _ in range(2 * room):  # both consumers saw the same room
            sch.add(stream.pop(0))
        out = step(sch, max_output=2)
        admitted += [s.seq.qos.tenant for s in out.scheduled if s.is_new]
    # in stream order light's would run 7th and 8th; fair order admits them in the first step
    assert admitted[:4] == ["heavy", "light", "heavy", "light"]


def pulled_shares(max_waiting: int, num_steps: int = 400) -> dict[str, float]:
    """Token shares when a bus head pulls, as `num_admittable` allows, from a stream where three
    tenants' requests (weights 3:2:1) arrive interleaved, each step while every tenant has requests
    waiting."""
    weights = {"gold": 3.0, "silver": 2.0, "bronze": 1.0}
    stream = [request(i * 3 + k, t, weight=w) for i in range(300) for k, (t, w) in enumerate(weights.items())]
    sch = make(max_seqs=4)
    tokens: Counter[str] = Counter()
    for _ in range(num_steps):
        room = sch.num_admittable(max_waiting)
        for _ in range(min(room, len(stream))):
            sch.add(stream.pop(0))
        if {s.qos.tenant for s in [*sch.waiting, *stream]} != set(weights):
            break  # a tenant has no request left waiting, here or upstream
        for s in step(sch, max_output=4).scheduled:
            tokens[s.seq.qos.tenant] += s.num_new_tokens
    total = sum(tokens.values())
    return {tenant: tokens[tenant] / total for tenant in weights}


def test_a_deep_queue_at_the_head_gives_each_tenant_its_weight_of_a_mixed_stream() -> None:
    """Fair share can only choose among what stage 0 has pulled: a queue as deep as the backlog gives
    3:2:1; one only as deep as the free slots admits in the stream's (equal) arrival order."""
    deep = pulled_shares(max_waiting=1024)
    for tenant, weight_share in {"gold": 0.5, "silver": 1 / 3, "bronze": 1 / 6}.items():
        assert abs(deep[tenant] - weight_share) <= 0.1 * weight_share, deep
    shallow = pulled_shares(max_waiting=1)
    assert abs(shallow["gold"] - shallow["bronze"]) < 0.05, shallow


def test_high_priority_is_admitted_before_normal_and_normal_before_low() -> None:
    sch = make(max_seqs=1)
    sch.add(request(0, "a", priority=Priority.LOW))
    sch.add(request(1, "b"))
    sch.add(request(2, "c", priority=Priority.HIGH))
    order = []
    for _ in range(30):
        out = step(sch, max_output=2)
        order += [s.seq.seq_id for s in out.scheduled if s.is_new]
    assert order == [2, 1, 0]


def test_decode_selection_under_a_seq_cap_is_fair_by_weight() -> None:
    sch = make(max_seqs=12)
    seqs = [request(i, "heavy", weight=3.0) for i in range(6)] + [
        request(1000 + i, "light") for i in range(6)
    ]
    for s in seqs:
        sch.add(s)
    tokens: Counter[str] = Counter()
    runs: Counter[int] = Counter()
    for n in range(61):  # all twelve prefill in the first step, then four decode in each
        out = step(sch, max_seqs=None if n == 0 else 4, max_output=1000)
        for scheduled in out.scheduled:
            tokens[scheduled.seq.qos.tenant] += scheduled.num_new_tokens
            runs[scheduled.seq.seq_id] += 1
    assert len(sch.running) == 12 and not sch.waiting
    assert abs(tokens["heavy"] / tokens["light"] - 3.0) < 0.3
    heavy_runs = [runs[s.seq_id] for s in seqs[:6]]
    assert max(heavy_runs) - min(heavy_runs) <= 1  # a tenant's sequences take turns


def test_one_anonymous_tenant_schedules_as_before() -> None:
    sch = make(max_seqs=8)
    for i in range(6):
        sch.add(Sequence(i, f"r{i}", [i * 10 + j for j in range(4)], SamplingParams()))
    assert [s.seq.seq_id for s in step(sch, max_seqs=3).scheduled] == [0, 1, 2]
    assert [s.seq.seq_id for s in step(sch, max_seqs=3).scheduled] == [0, 1, 2]  # decode first
    assert [s.seq.seq_id for s in step(sch, max_seqs=8).scheduled] == [0, 1, 2, 3, 4, 5]


def test_a_preempted_sequence_goes_back_to_the_head_of_its_tenant_queue() -> None:
    sch = make(max_seqs=8, num_blocks=4)
    a, b = request(0, "t"), request(1, "t")
    for s in (a, b):
        sch.add(s)
    step(sch)  # a and b fill a block each
    sch.add(request(2, "t"))  # queued behind them; no block is ever free for it
    for _ in range(8):
        step(sch, max_output=100)  # a and b grow into a second block each, then need a third
        if sch.num_preemptions:
            break
    assert b.num_preemptions == 1 and a.num_preemptions == 0  # the most recently admitted
    assert sch.waiting.peek() is b and [s.seq_id for s in sch.waiting] == [1, 2]
