"""Which requests stage 0 takes off the stream, as plain rules: the routes it serves, and when a
request it cannot open yet goes back to the stream.

Design. Stage 0 pulls from two consumers: the requests routed to its own pipeline (round robin,
prefix affinity) and the model's shared ones, which every pipeline's stage 0 pulls (least-queue
routing). Requests routed to a pipeline that is no longer active would wait on a route nobody
pulls, so the stage 0 of the lowest active pipeline also drains those (`Routes`; the node keeps it
current as the plan changes). A request sealed to a key this node has not adopted yet (a gateway
saw the new sealing key a moment earlier) goes back to the stream a few times before it is
refused (`retry_unopened`). `RequestIntake` does the pulling; these decide.
"""

from __future__ import annotations

from collections.abc import Set

# a request this stage 0 cannot open yet goes back to the stream this many times before it is refused
UNOPENED_REDELIVERIES = 5
UNOPENED_RETRY_S = 1.0


class Routes:
    def __init__(self, own: int) -> None:
        self.own = own  # the pipeline this stage 0 heads: requests routed to it come first
        self.active: frozenset[int] = frozenset({own})
        self.drains = False  # whether this stage 0 drains inactive pipelines' routes

    def follow(self, active: Set[int], *, drains: bool) -> None:
        """The plan's active pipelines now, and whether this stage 0 is the one to drain the rest."""
        self.active, self.drains = frozenset(active), drains

    def should_drain(self, route: int | None, num_waiting: int) -> bool:
        """Whether to take requests from the consumer of `route` (None: not a route's consumer),
        which has `num_waiting` requests pending or unacked."""
        return self.drains and route is not None and route not in self.active and num_waiting > 0


def retry_unopened(reason: str, num_delivered: int) -> bool:
    """Whether a request that failed to open for `reason`, delivered `num_delivered` times, goes
    back to the stream (its key may reach this node in a moment) rather than being refused."""
    return reason == "untrusted" and num_delivered < UNOPENED_REDELIVERIES
