"""The resume budget as a plain object: `max_resumes` expiries in a row are resumed, the next ends the
request, and a token in between starts the count again; the node setting reaches it."""

from __future__ import annotations

import pytest

from mohawk_shard.node.config import NodeSettings
from mohawk_shard.node.resume_budget import ResumeBudget


def expire_until_spent(budget: ResumeBudget, request_id: str) -> int:
    """Expire `request_id` until the budget says stop; how many resumes it got."""
    for resumes in range(100):
        count = budget.expired(request_id)
        if count is None:
            return resumes
        budget.resumed(request_id, count)
    raise AssertionError("the budget never ran out")


@pytest.mark.parametrize("max_resumes", [0, 1, 3])
def test_max_resumes_in_a_row_then_the_request_ends(max_resumes: int) -> None:
    assert expire_until_spent(ResumeBudget(max_resumes), "r1") == max_resumes


def test_a_token_starts_the_count_again_and_requests_count_apart() -> None:
    budget = ResumeBudget(2)
    for _ in range(2):
        budget.resumed("r1", budget.expired("r1") or 0)
    assert budget.expired("r1") is None  # spent
    budget.progressed("r1")  # a token came
    assert budget.expired("r1") == 1
    assert budget.expired("r2") == 1  # another request has its own count


def test_the_node_setting_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NodeSettings().max_resumes == 3
    monkeypatch.setenv("MOHAWK_MAX_RESUMES", "5")
    assert NodeSettings().max_resumes == 5
    monkeypatch.setenv("MOHAWK_MAX_RESUMES", "-1")
    with pytest.raises(ValueError, match="max_resumes"):
        NodeSettings()
