"""How many times in a row stage 0 resumes a request whose steps expire with no token in between.

A step given up (its deadline passed: frames lost, a stage died) frees its sequences and resumes
them from the tokens the token stream holds. A request that keeps expiring with no token in
between would loop for ever; after `max_resumes` such resumes in a row its next expiry ends it with
an error instead. Any token the request gets starts its count again. Plain bookkeeping, no bus:
stage 0 (`HeadDriver`, and `Upkeep` when a step expires) calls it.
"""

from __future__ import annotations


class ResumeBudget:
    def __init__(self, max_resumes: int) -> None:
        self.max_resumes = max_resumes
        self._expiries: dict[str, int] = {}  # request id -> steps expired since its last token

    def expired(self, request_id: str) -> int | None:
        """A step of `request_id` expired: the count of expiries in a row to record if it is
        resumed (`resumed`), or None when the budget is spent and the request must end."""
        count = self._expiries.get(request_id, 0) + 1
        return None if count > self.max_resumes else count

    def resumed(self, request_id: str, count: int) -> None:
        self._expiries[request_id] = count

    def progressed(self, request_id: str) -> None:
        """`request_id` got a token (or ended): its next expiry counts from one again."""
        self._expiries.pop(request_id, None)
