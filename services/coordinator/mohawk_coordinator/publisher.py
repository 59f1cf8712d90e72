"""The plan in KV: read it with its revision, write it only over the revision that was read.

Every write is a compare-and-set on the key's revision (`create` when there is none), so of two
coordinators that both believe they lead, at most one write lands on a given revision; the other
gets `PlanConflictError` and must re-read (or step down). Versions only grow: a new plan takes
the stored version + 1, and when the key was deleted or holds a record that is not adopted, the
highest version signed in its history or remembered by the reader (`high_water.py`). Only a
record that parses, carries a version in bounds and verifies as a coordinator's counts: whatever
else a writer of the key puts there is rejected (counted by the reader's `reject`) and changes no
version, so no record can push the versions out of range, and a signed record older than the
reader's floor (an old plan put back from the key's history) is a replay, never adopted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.plan_follower import verified_plan
from mohawk_common.errors import MohawkError
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2


class PlanConflictError(MohawkError):
    """Someone wrote the plan since this writer read it."""


@dataclass(frozen=True, slots=True)
class StoredPlan:
    plan: bus_pb2.Plan | None
    revision: int  # 0 when the key holds no plan: write with create
    version: int  # the highest version published so far (0 = none)
    rejected: bool = False  # the key held a record not adopted: malformed, unsigned or a replay


class PlanStore:
    def __init__(
        self,
        kv: KeyValue,
        verifier: RecordVerifier | None = None,
        reject: Callable[[AuthenticationError], None] | None = None,
    ) -> None:
        self.kv = kv
        self.verifier = verifier or RecordVerifier(None)
        self.reject = reject

    async def read(self, floor: int = 0) -> StoredPlan:
        """The stored plan when it is a coordinator's (parsed, in bounds, signed) and not older
        than `floor` (the highest version the reader has seen signed), else none; the version is
        the highest signed one known, so the next plan is newer than anything readers follow."""
        try:
            entry = await self.kv.get(names.PLAN_KEY)
        except KeyNotFoundError:
            return StoredPlan(None, 0, max(floor, await self._highest_version()))
        revision = entry.revision or 0
        if not entry.value:
            return StoredPlan(None, revision, max(floor, await self._highest_version()))
        try:
            plan = verified_plan(entry.value, self.verifier)
            if plan.version < floor:
                raise AuthenticationError(
                    "replayed", f"plan version {plan.version} is older than version {floor}, seen signed"
                )
        except AuthenticationError as exc:
            if self.reject is not None:
                self.reject(exc)
            return StoredPlan(None, revision, max(floor, await self._highest_version()), rejected=True)
        return StoredPlan(plan, revision, max(floor, plan.version))

    async def write(self, plan: bus_pb2.Plan, last_revision: int) -> int:
        """Write `plan` if the key is still at `last_revision`; the new revision."""
        data = encode_json(plan)
        try:
            if last_revision:
                return await self.kv.update(names.PLAN_KEY, data, last=last_revision)
            return await self.kv.create(names.PLAN_KEY, data)
        except KeyWrongLastSequenceError as exc:
            raise PlanConflictError(
                f"plan key changed since revision {last_revision}; not writing version {plan.version}"
            ) from exc

    async def _highest_version(self) -> int:
        try:
            entries = await self.kv.history(names.PLAN_KEY)
        except (NoKeysError, KeyNotFoundError):
            return 0
        versions = [0]
        for entry in entries:
            with contextlib.suppress(AuthenticationError):  # only what a coordinator signed counts
                versions.append(verified_plan(entry.value or b"", self.verifier).version)
        return max(versions)
