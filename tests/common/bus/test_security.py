"""A process's certificate bound to a model: the process refuses to start for another model."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_common.bus.config import BusSettings
from mohawk_common.bus.security import Security
from mohawk_common.errors import ConfigError
from mohawk_pqc.pki_files import init_pki, issue_node


def start(bundle: Path, role: str, model: str) -> Security:
    settings = BusSettings.model_validate({"pki_dir": bundle})
    return Security.for_service(settings, role=role, process_id="n", models=(model,))


@pytest.mark.parametrize("role", ["shard", "gateway"])
def test_a_certificate_bound_to_one_model_starts_only_for_it(tmp_path: Path, role: str) -> None:
    init_pki(tmp_path)
    bound = issue_node(tmp_path, "bound", role, models=("model-a",))
    assert start(bound, role, "model-a").secure
    with pytest.raises(ConfigError) as info:
        start(bound, role, "model-b")
    assert str(info.value).splitlines() == [
        f"bound's certificate is for model 'model-a', not 'model-b': a {role} certificate serves only its "
        "model; issue one for 'model-b' (mohawk pki issue --model model-b)"
    ]
    unbound = issue_node(tmp_path, "unbound", role)  # as issued before certificates named a model
    assert start(unbound, role, "model-b").secure
