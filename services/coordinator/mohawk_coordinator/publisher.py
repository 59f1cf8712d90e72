"""The plan in KV: read it with its revision, write it only over the revision that was read.

Every write is a compare-and-set on the key's revision (`create` when there is none), so of two
coordinators that both believe they lead, at most one write lands on a given revision; the other
gets `PlanConflictError` and must re-read (or step down). Versions only grow: a new plan takes
the stored version + 1, and when the key was deleted, the highest version left in its history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.control import decode_json, encode_json
from mohawk_common.bus.control_records import RecordVerifier
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
    rejected: bool = False  # the key held a record that did not verify as a coordinator's


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

    async def read(self) -> StoredPlan:
        """The stored plan when it is a coordinator's (signature verified), else none; either way
        the version counts, so the next plan is newer than anything readers may have seen."""
        try:
            entry = await self.kv.get(names.PLAN_KEY)
        except KeyNotFoundError:
            return StoredPlan(None, 0, await self._highest_version())
        if not entry.value:
            return StoredPlan(None, entry.revision or 0, await self._highest_version())
        plan = decode_json(bus_pb2.Plan, entry.value)
        try:
            self.verifier.verify(plan, "plan")
        except AuthenticationError as exc:
            if self.reject is not None:
                self.reject(exc)
            version = max(plan.version, await self._highest_version())
            return StoredPlan(None, entry.revision or 0, version, rejected=True)
        return StoredPlan(plan, entry.revision or 0, plan.version)

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
        versions = [decode_json(bus_pb2.Plan, e.value).version for e in entries if e.value]
        return max(versions, default=0)
