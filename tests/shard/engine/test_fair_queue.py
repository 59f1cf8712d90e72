"""Fair queue: strict priority classes, tenants by weighted virtual time, no credit banked while idle."""

from __future__ import annotations

import pytest

from mohawk_common.errors import InvalidRequestError
from mohawk_shard.engine.fair_queue import FairQueue, TenantClocks
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.sequence import Priority, QoS, Sequence


def seq(seq_id: int, tenant: str = "", priority: Priority = Priority.NORMAL, weight: float = 1.0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", [1, 2, 3], SamplingParams(), qos=QoS(tenant, priority, weight))


def queue_of(*seqs: Sequence) -> FairQueue:
    queue = FairQueue(TenantClocks())
    for s in seqs:
        queue.clocks.join(s)
        queue.append(s)
    return queue


def drain(queue: FairQueue, tokens_each: int = 1) -> list[int]:
    """Admit everything, one at a time, charging each admitted sequence `tokens_each` tokens."""
    order = []
    while (head := queue.peek()) is not None:
        queue.remove(head)
        queue.clocks.charge(head, tokens_each)
        order.append(head.seq_id)
    return order


def test_one_tenant_keeps_arrival_order() -> None:
    queue = queue_of(*(seq(i) for i in range(5)))
    assert [s.seq_id for s in queue] == [0, 1, 2, 3, 4]
    assert len(queue) == 5 and drain(queue) == [0, 1, 2, 3, 4] and not queue


def test_priority_classes_are_strict() -> None:
    queue = queue_of(
        seq(0, "a", Priority.LOW),
        seq(1, "b"),
        seq(2, "c", Priority.HIGH),
        seq(3, "a"),
        seq(4, "b", Priority.HIGH),
    )
    assert drain(queue, tokens_each=100) == [2, 4, 1, 3, 0]


def test_tenants_share_by_weight() -> None:
    heavy = [seq(i, "heavy", weight=3.0) for i in range(40)]
    light = [seq(100 + i, "light") for i in range(40)]
    order = drain(queue_of(*heavy, *light))[:40]  # all heavy arrived first
    assert sum(i < 100 for i in order) == 30  # 3:1 while both have work


def test_an_idle_tenant_banks_no_credit() -> None:
    clocks = TenantClocks()
    busy, idle = seq(0, "busy"), seq(1, "idle")
    clocks.join(busy)
    for _ in range(50):
        clocks.charge(busy, 10)  # 500 tokens served to "busy" while "idle" had nothing queued
    clocks.join(idle)
    assert clocks.vtime(Priority.NORMAL, "idle") == pytest.approx(490.0)  # the system virtual time
    later = seq(2, "busy")
    queue = FairQueue(clocks)
    queue.append(idle)
    clocks.join(later)
    queue.append(later)
    assert drain(queue, tokens_each=10) == [1, 2]  # idle first once, then they alternate, no burst


def test_a_tenant_that_leaves_keeps_its_lead() -> None:
    clocks = TenantClocks()
    a, b = seq(0, "a"), seq(1, "b")
    clocks.join(a)
    clocks.join(b)
    clocks.charge(a, 100)
    clocks.charge(b, 10)
    clocks.leave(a)
    clocks.join(seq(2, "a"))  # back at once: still 90 tokens ahead of b
    assert clocks.vtime(Priority.NORMAL, "a") == 100.0


def test_a_tenant_with_work_running_but_none_queued_banks_no_credit_either() -> None:
    """`gold` (weight 3) keeps one sequence running and nothing queued while `bronze` is served 300
    tokens; gold's new work then shares by weight from bronze's virtual time, not all before it."""
    clocks = TenantClocks()
    queue = FairQueue(clocks)
    running = seq(0, "gold", weight=3.0)
    clocks.join(running)  # admitted: running, not queued
    bronze = [seq(100 + i, "bronze") for i in range(40)]
    for s in bronze:
        clocks.join(s)
        queue.append(s)
    for _ in range(30):
        head = queue.peek()
        assert head is not None and head.qos.tenant == "bronze"
        queue.remove(head)
        clocks.charge(head, 10)
    assert clocks.vtime(Priority.NORMAL, "gold") == 0.0
    gold = [seq(1 + i, "gold", weight=3.0) for i in range(30)]
    for s in gold:
        clocks.join(s)
        queue.append(s)
    assert clocks.vtime(Priority.NORMAL, "gold") == pytest.approx(300.0)  # bronze's, lifted to
    order = drain(queue, tokens_each=10)[:8]
    assert sum(i < 100 for i in order) == 6  # 3:1 from here, not 30 of gold's first


def test_a_tenant_with_work_running_that_joins_an_empty_queue_starts_at_the_system_virtual_time() -> None:
    """`bronze` is served 300 tokens while `gold` keeps a sequence running, and bronze's queue runs
    empty between its arrivals: gold's new work joins no queue of anyone's, so it is lifted to the
    system virtual time (bronze's), and the two then share by weight, rather than gold taking all
    until it caught up on 300 tokens it never asked for."""
    clocks = TenantClocks()
    queue = FairQueue(clocks)
    clocks.join(seq(0, "gold", weight=3.0))  # admitted: running, not queued
    for i in range(30):  # bronze's requests one at a time, each admitted before the next arrives
        arrival = seq(100 + i, "bronze")
        clocks.join(arrival)
        queue.append(arrival)
        queue.remove(arrival)
        clocks.charge(arrival, 10)
    assert clocks.vtime(Priority.NORMAL, "gold") == 0.0 and not queue
    gold = [seq(1 + i, "gold", weight=3.0) for i in range(30)]
    for s in gold:
        clocks.join(s)
        queue.append(s)
    assert clocks.vtime(Priority.NORMAL, "gold") == pytest.approx(290.0)  # bronze's when last served
    bronze = [seq(200 + i, "bronze") for i in range(10)]
    for s in bronze:
        clocks.join(s)
        queue.append(s)
    order = drain(queue, tokens_each=10)[:20]
    assert 14 <= sum(i < 100 for i in order) <= 16  # 3:1 from here (gold starts 10 tokens behind)
    assert min(i for i, seq_id in enumerate(order) if seq_id >= 100) <= 4  # not after all 30 of gold's


def test_a_preempted_sequence_put_back_is_not_lifted_but_new_work_is() -> None:
    queue = queue_of(seq(100, "bronze"))
    clocks = queue.clocks
    clocks.charge(seq(100, "bronze"), 50)
    preempted = seq(0, "gold")
    clocks.join(preempted)
    clocks.charge(preempted, 5)
    queue.appendleft(preempted)
    assert clocks.vtime(Priority.NORMAL, "gold") == 5.0
    queue.remove(preempted)
    queue.append(preempted)
    assert clocks.vtime(Priority.NORMAL, "gold") == 50.0


def test_order_picks_a_step_by_weight_without_charging() -> None:
    clocks = TenantClocks()
    heavy = [seq(i, "heavy", weight=3.0) for i in range(6)]
    light = [seq(10 + i, "light") for i in range(6)]
    for s in heavy + light:
        clocks.join(s)
    picked = clocks.order(heavy + light, lambda s: 1)[:4]
    assert [s.seq_id for s in picked] == [0, 10, 1, 2]  # each tenant's sequences in the given order
    assert clocks.vtime(Priority.NORMAL, "heavy") == clocks.vtime(Priority.NORMAL, "light") == 0.0


def test_qos_is_validated() -> None:
    assert QoS.create(weight=0).weight == 1.0  # the wire's unset value
    with pytest.raises(InvalidRequestError):
        QoS.create(weight=-1)
    with pytest.raises(InvalidRequestError):
        QoS.create(latency_budget_ms=float("nan"))


def test_a_resumed_sequence_goes_ahead_of_new_work_behind_earlier_resumed_ones() -> None:
    """Its client has seen tokens already: its re-prefill comes before its tenant's new requests,
    and resumed sequences keep their own order among themselves."""
    queue = queue_of(seq(0), seq(1))
    for seq_id in (7, 8):
        resumed = seq(seq_id)
        resumed.resumed_at = 1.0
        queue.clocks.join(resumed)
        queue.append_resumed(resumed)
    assert drain(queue) == [7, 8, 0, 1]


def test_a_resumed_sequence_does_not_jump_another_tenants_turn() -> None:
    queue = queue_of(seq(0, "a"), seq(1, "b"))
    queue.clocks.charge(next(iter(queue)), 10)  # a is ahead by 10 tokens: b's turn
    resumed = seq(2, "a")
    resumed.resumed_at = 1.0
    queue.clocks.join(resumed)
    queue.append_resumed(resumed)
    assert drain(queue, tokens_each=20) == [1, 2, 0]
