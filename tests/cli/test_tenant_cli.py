"""`mohawk tenant` against a real Redis: a key printed once that the gateways' `by_key` knows, a
table of tenants, rotation that kills the old key at once, removal, and one-line errors.

The first test runs `mohawk tenant` as subprocesses, exactly as an operator does; the rest call
the same `main()` in this process, which is much faster than a Python start per command.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from mohawk_cli.redis_server import RedisServer, ensure_password, find_redis_server
from mohawk_common.bus.server import free_port
from mohawk_common.tenancy import Tenant, TenantStore, connect
from tests.cli.helpers import mohawk, mohawk_in_process
from tests.real_parts import missing


def mohawk_tenant(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return mohawk("tenant", *args, "--redis-url", redis_url, timeout=120)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`mohawk tenant ...` in this process: exit status, stdout, stderr."""
    return mohawk_in_process(capsys, "tenant", *args)


def by_key(redis_url: str, api_key: str) -> Tenant | None:
    async def lookup() -> Tenant | None:
        client = connect(redis_url)
        try:
            return await TenantStore(client).by_key(api_key)
        finally:
            await client.aclose()

    return asyncio.run(lookup())


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.slow  # over 5 s here: the inner loop leaves it to `make test`
def test_an_operator_adds_rotates_and_removes_a_tenant(redis_url: str) -> None:
    added = mohawk_tenant(redis_url, "add", "acme", "--rpm", "60", "--priority", "high")
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("mk-") and "\n" not in key
    assert "cannot be shown again" in one_line(added.stderr)
    tenant = by_key(redis_url, key)
    assert tenant is not None and (tenant.name, tenant.rpm, tenant.priority) == ("acme", 60, "high")

    rotated = mohawk_tenant(redis_url, "rotate-key", "acme")
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert new_key.startswith("mk-") and new_key != key
    assert by_key(redis_url, key) is None  # the old key stops working at once
    assert by_key(redis_url, new_key) == tenant.model_copy(update={"key_prefix": new_key[:8]})

    removed = mohawk_tenant(redis_url, "rm", "acme")
    assert removed.returncode == 0 and "removed 'acme'" in removed.stderr
    assert by_key(redis_url, new_key) is None


def test_ls_and_show_print_every_limit(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "ls", "--redis-url", redis_url)
    assert code == 0 and out == "" and "no tenants" in err
    code, key, _ = cli(
        capsys,
        "add",
        "beta",
        "--tpm",
        "10000",
        "--max-concurrency",
        "4",
        "--weight",
        "2.5",
        "--redis-url",
        redis_url,
    )
    assert code == 0
    assert cli(capsys, "add", "alpha", "--redis-url", redis_url)[0] == 0
    code, out, _ = cli(capsys, "ls", "--redis-url", redis_url)
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "LABEL", "PRIORITY", "WEIGHT", "RPM", "TPM", "CONCURRENCY", "KEY"]
    assert rows[1] == ["alpha", rows[1][1], "normal", "1", "-", "-", "-", rows[1][7]]
    assert rows[2] == ["beta", rows[2][1], "normal", "2.5", "-", "10000", "4", f"{key.strip()[:8]}..."]
    # the label telemetry shows for it: not its name, and another for each tenant
    assert rows[1][1].startswith("t-") and rows[1][1] != rows[2][1] and "beta" not in rows[2][1]
    assert key.strip() not in out  # only its prefix is ever shown again
    code, out, _ = cli(capsys, "show", "beta", "--redis-url", redis_url)
    assert code == 0
    shown = dict(line.split(":", 1) for line in out.splitlines())
    assert {k: v.strip() for k, v in shown.items() if k != "created"} == {
        "name": "beta",
        "label": f"{rows[2][1]} (its name in telemetry)",
        "priority": "normal",
        "weight": "2.5",
        "rpm": "-",
        "tpm": "10000",
        "max concurrency": "4",
        "ttft objective": "the gateway's",
        "key": f"{key.strip()[:8]}...",
    }


def test_update_changes_limits_and_keeps_the_key(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, key, _ = cli(capsys, "add", "acme", "--rpm", "10", "--tpm", "500", "--redis-url", redis_url)
    assert code == 0
    code, _, err = cli(
        capsys, "update", "acme", "--rpm", "none", "--priority", "low", "--redis-url", redis_url
    )
    assert code == 0 and "rpm -" in err
    tenant = by_key(redis_url, key.strip())
    assert tenant is not None and (tenant.rpm, tenant.tpm, tenant.priority) == (None, 500, "low")
    assert cli(capsys, "update", "acme", "--ttft-objective-s", "5", "--redis-url", redis_url)[0] == 0
    tenant = by_key(redis_url, key.strip())
    assert tenant is not None and tenant.ttft_objective_s == 5.0 and tenant.rpm is None  # the rest kept


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("show", "nobody"), 2, "no tenant 'nobody'"),
        (("rm", "nobody"), 2, "no tenant 'nobody'"),
        (("rotate-key", "nobody"), 2, "no tenant 'nobody'"),
        (("add", "Not-A-Name"), 2, "invalid tenant: name"),
        (("add", "acme", "--weight", "0"), 2, "invalid tenant: weight"),
        (("add", "acme", "--rpm", "0"), 2, "--rpm: want at least 1"),
    ],
)
def test_operator_mistakes_are_one_line_and_exit_2(
    redis_url: str, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, message: str
) -> None:
    status, out, err = cli(capsys, *args, "--redis-url", redis_url)
    assert status == code and out == ""
    assert message in one_line(err)


def test_adding_a_name_twice_fails_and_keeps_the_first_key(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, key, _ = cli(capsys, "add", "acme", "--redis-url", redis_url)
    assert code == 0
    code, out, err = cli(capsys, "add", "acme", "--rpm", "1", "--redis-url", redis_url)
    assert code == 2 and out == "" and "already exists" in one_line(err)
    tenant = by_key(redis_url, key.strip())
    assert tenant is not None and tenant.rpm is None


def test_an_unreachable_redis_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("MOHAWK_REDIS_URL", url)  # the default when --redis-url is not given
    code, out, err = cli(capsys, "ls")
    assert code == 1 and out == ""
    line = one_line(err)
    assert "cannot reach Redis at redis://:***@127.0.0.1" in line and "hunter2" not in line


def test_a_redis_with_a_password_takes_it_from_a_file_and_refuses_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mohawk up`'s Redis wants its password: `--redis-password-file` (or the variable) gives it;
    without it, one line saying authentication failed, exit status 1."""
    if find_redis_server() is None:
        missing("redis-server")
    password_file = tmp_path / "password"
    server = RedisServer(tmp_path / "redis", persist=False, password=ensure_password(password_file)).start()
    try:
        code, _, err = cli(capsys, "ls", "--redis-url", server.public_url)
        assert code == 1 and len(err.strip().splitlines()) == 1 and "give its password" in err, err
        code, out, err = cli(
            capsys,
            "add",
            "acme",
            "--redis-url",
            server.public_url,
            "--redis-password-file",
            str(password_file),
        )
        assert code == 0 and out.strip().startswith("mk-"), err
        monkeypatch.setenv("MOHAWK_REDIS_PASSWORD_FILE", str(password_file))
        code, out, err = cli(capsys, "ls", "--redis-url", server.public_url)
        assert code == 0 and "acme" in out, err
        code, _, err = cli(
            capsys, "ls", "--redis-url", server.public_url, "--redis-password-file", str(tmp_path)
        )
        assert code == 2 and "cannot read the Redis password file" in err, err
    finally:
        server.stop()
