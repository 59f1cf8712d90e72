"""The telemetry service in docker-compose.yml and the `observability` profile beside it.

`docker compose up` starts telemetry but not Prometheus and Grafana; `--profile observability`
adds them. Prometheus' targets must be compose services on the ports those services serve
/metrics on, Grafana's provisioning must point where compose mounts it, and the dashboard may
chart only what the telemetry service exports (mohawk_telemetry's METRICS). Fast: no Docker
engine, no network; Compose itself runs where test_compose.py finds one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mohawk_telemetry.metric_names import METRICS
from tests.deploy.test_compose import (
    COMPOSE_FILE,
    MOHAWK_SERVICES,
    ROOT,
    active_services,
    compose_impls,
    depends_on,
    env_of,
    mounts,
    port_bindings,
    published_ports,
    raw,
    resolved,
)

PROFILE = "observability"
OBSERVABILITY = {"prometheus", "grafana", "jaeger"}
PROMETHEUS_FILE = ROOT / "config" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "config" / "grafana"
DATASOURCES_FILE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS_FILE = GRAFANA / "provisioning" / "dashboards" / "mohawk.yml"
DASHBOARD_FILE = GRAFANA / "dashboards" / "mohawk.json"
TELEMETRY_JOB = "telemetry"  # the Prometheus job the dashboard reads
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"  # the grafana image's GF_PATHS_PROVISIONING
GRAFANA_COLUMNS = 24


def services() -> dict[str, Any]:
    return raw(COMPOSE_FILE)["services"]


def services_to_start(compose: list[str], *profiles: str) -> set[str]:
    """What `docker compose [--profile P ...] up` starts, as this implementation resolves the file.

    1.29 accepts `--profile` but its `config` (and `config --services`) lists every service
    anyway, so the selection comes from the resolved `profiles` keys (`active_services`).
    """
    options = [arg for profile in profiles for arg in ("--profile", profile)]
    return set(active_services(resolved(compose, COMPOSE_FILE, *options), frozenset(profiles)))


def loopback_only(service: dict[str, Any]) -> bool:
    return all(str(port).startswith("127.0.0.1:") for port in service.get("ports") or [])


def mount_target(service: dict[str, Any], source: str) -> str:
    return next(target for src, target in mounts(service) if src == source)


def metrics_port(service: dict[str, Any]) -> int:
    """The port a Mohawk service serves /metrics on: its metrics port, else its HTTP port."""
    env, command = env_of(service), service["command"]
    if "MOHAWK_METRICS_PORT" in env:
        return int(env["MOHAWK_METRICS_PORT"])
    if "--port" in command:
        return int(command[command.index("--port") + 1])
    return int(env["MOHAWK_PORT"])


# --- compose: with and without the profile --------------------------------------------------------


@compose_impls
def test_the_profile_adds_prometheus_grafana_and_jaeger_and_nothing_else(compose: list[str]) -> None:
    default = services_to_start(compose)
    assert "telemetry" in default
    assert not default & OBSERVABILITY, "`docker compose up` alone must not start them"
    assert services_to_start(compose, PROFILE) == default | OBSERVABILITY


@compose_impls
def test_the_profile_resolves_with_no_variable_set(compose: list[str]) -> None:
    """No admin password or other secret has to be set for `--profile observability`."""
    config = resolved(compose, COMPOSE_FILE, COMPOSE_PROFILES=PROFILE)
    services = active_services(config, frozenset({PROFILE}))
    for name in OBSERVABILITY:
        service = services[name]
        for source, _ in mounts(service):
            if source.startswith("/"):
                assert Path(source).exists(), f"{name}: bind mount {source} does not exist"
        assert {host_ip for host_ip, _, _ in port_bindings(service)} == {"127.0.0.1"}, name
    assert depends_on(services["grafana"]) == {"prometheus": "service_started"}
    assert "prometheus-data" in config["volumes"]


def test_telemetry_runs_the_mohawk_image_on_loopback_9300() -> None:
    telemetry, gateway = services()["telemetry"], services()["gateway"]
    assert (telemetry["image"], telemetry["build"]) == (gateway["image"], gateway["build"])
    # it verifies plans and heartbeats against the root.pub compose-bundles puts beside its credential
    assert telemetry["command"] == [
        "telemetry",
        "--host",
        "0.0.0.0",
        "--port",
        "9300",
        "--trust-root",
        "/pki/root.pub",
    ]
    assert telemetry["ports"] == ["127.0.0.1:9300:9300"]
    assert telemetry["restart"] == "unless-stopped"
    assert telemetry["depends_on"]["nats"]["condition"] == "service_healthy"
    # its own NATS credential and root.pub only (`mohawk pki compose-bundles`), read-only; no PKI volume
    assert telemetry["volumes"] == ["${MOHAWK_BUNDLES_DIR:-./mohawk-bundles}/telemetry:/pki:ro"]
    env = env_of(telemetry)
    assert {"MOHAWK_NATS_URL", "MOHAWK_NATS_CREDS", "MOHAWK_INSECURE"} <= set(env)
    assert "MOHAWK_DEV_PKI_DIR" not in env
    assert "9300/metrics" in " ".join(telemetry["healthcheck"]["test"])
    assert not telemetry.get("profiles")


def test_shard_nodes_coordinators_and_gateways_serve_metrics_on_the_compose_network_only() -> None:
    for name, port in (("shard-node", 9400), ("coordinator", 9401), ("gateway", 9402)):
        service = services()[name]
        assert int(env_of(service)["MOHAWK_METRICS_PORT"]) == port, name
        # the default binds loopback only: Prometheus, another container, needs every interface
        assert env_of(service)["MOHAWK_METRICS_HOST"] == "0.0.0.0", name
        assert not service.get("expose") and port not in {t for _, t in published_ports(service)}, name


def test_prometheus_and_grafana_are_pinned_profiled_and_on_loopback() -> None:
    document = raw(COMPOSE_FILE)
    prometheus, grafana = document["services"]["prometheus"], document["services"]["grafana"]
    assert prometheus["image"] == "prom/prometheus:v3.5.0"
    assert grafana["image"] == "grafana/grafana:12.1.0"
    for service in (prometheus, grafana):
        assert service["profiles"] == [PROFILE]
        assert service["restart"] == "unless-stopped"
        assert loopback_only(service)
    assert published_ports(prometheus) == {("9090", 9090)}
    assert published_ports(grafana) == {("3000", 3000)}
    config_path = mount_target(prometheus, "./config/prometheus/prometheus.yml")
    assert f"--config.file={config_path}" in prometheus["command"]
    data_path = mount_target(prometheus, "prometheus-data")
    assert f"--storage.tsdb.path={data_path}" in prometheus["command"]
    assert "prometheus-data" in document["volumes"]
    assert all(volume.endswith(":ro") for volume in grafana["volumes"])
    assert all(volume.endswith(":ro") for volume in prometheus["volumes"] if volume.startswith("./"))


def test_jaeger_is_pinned_profiled_and_its_ui_alone_on_loopback() -> None:
    jaeger = raw(COMPOSE_FILE)["services"]["jaeger"]
    assert jaeger["image"] == "jaegertracing/jaeger:2.8.0"
    assert jaeger["profiles"] == [PROFILE]
    assert loopback_only(jaeger)
    assert published_ports(jaeger) == {("16686", 16686)}  # OTLP (4318) stays on the compose network


def test_the_services_that_trace_pass_an_otlp_endpoint_through_when_it_is_set() -> None:
    for name in ("gateway", "shard-node"):
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" in env_of(services()[name]), name


def test_grafana_lets_anyone_view_and_keeps_no_password() -> None:
    env = env_of(services()["grafana"])
    assert str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    password = env.get("GF_SECURITY_ADMIN_PASSWORD")
    assert password is None or str(password).startswith("${"), "no password in the repository"
    if password is None:  # then there must be no admin/admin to log in as
        assert str(env["GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION"]).lower() == "true"
        assert str(env["GF_AUTH_DISABLE_LOGIN_FORM"]).lower() == "true"


# --- Prometheus ---------------------------------------------------------------------------------


def scrape_targets() -> dict[str, set[tuple[str, int]]]:
    """(host, port) of each job, from static targets and DNS names alike."""
    targets: dict[str, set[tuple[str, int]]] = {}
    for job in yaml.safe_load(PROMETHEUS_FILE.read_text())["scrape_configs"]:
        found = targets.setdefault(job["job_name"], set())
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                found.add((host, int(port)))
        for dns in job.get("dns_sd_configs", []):
            assert dns.get("type", "SRV") == "A", "compose's DNS answers A records"
            found.update((name, int(dns["port"])) for name in dns["names"])
        assert job.get("metrics_path", "/metrics") == "/metrics"
    return targets


def test_prometheus_scrapes_every_5s() -> None:
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())["global"]
    assert config["scrape_interval"] == "5s"
    assert int(config["scrape_timeout"].rstrip("s")) < 5


def test_prometheus_scrapes_every_mohawk_service_on_its_metrics_port() -> None:
    targets = scrape_targets()
    compose_services = services()
    scraped = {host for job in targets.values() for host, _ in job}
    assert scraped == MOHAWK_SERVICES
    for job, hosts in targets.items():
        for host, port in hosts:
            assert port == metrics_port(compose_services[host]), f"job {job}: {host}:{port}"
    assert targets[TELEMETRY_JOB] == {("telemetry", 9300)}
    # not the API port: its /metrics needs MOHAWK_METRICS_KEY when API keys are on
    assert targets["gateway"] == {("gateway", 9402)}
    assert env_of(compose_services["gateway"])["MOHAWK_METRICS_KEY"] is None  # passed through when set


def test_scaled_shard_nodes_are_each_scraped() -> None:
    """`--scale shard-node=N`: a static target would reach one replica; DNS finds them all."""
    jobs = yaml.safe_load(PROMETHEUS_FILE.read_text())["scrape_configs"]
    shard_jobs = [
        job for job in jobs if any("shard-node" in d["names"] for d in job.get("dns_sd_configs", []))
    ]
    assert shard_jobs
    assert not any("shard-node" in str(job.get("static_configs")) for job in jobs)


# --- Grafana provisioning -------------------------------------------------------------------------


def test_the_datasource_is_the_compose_prometheus() -> None:
    (datasource,) = yaml.safe_load(DATASOURCES_FILE.read_text())["datasources"]
    assert datasource["uid"] == "prometheus" and datasource["type"] == "prometheus"
    assert datasource["isDefault"] is True
    host, port = datasource["url"].removeprefix("http://").split(":")
    assert host in services() and ("9090", int(port)) in published_ports(services()[host])


def test_provisioning_points_at_what_compose_mounts() -> None:
    grafana = services()["grafana"]
    assert mount_target(grafana, "./config/grafana/provisioning") == GRAFANA_PROVISIONING
    (provider,) = yaml.safe_load(PROVIDERS_FILE.read_text())["providers"]
    assert provider["type"] == "file"
    dashboards = mount_target(grafana, "./config/grafana/dashboards")
    assert provider["options"]["path"] == dashboards
    home = env_of(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards}/{DASHBOARD_FILE.name}"


# --- the dashboard ------------------------------------------------------------------------------

# Words in PromQL that are neither functions nor metric names.
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_KEYWORDS |= {"group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> list[str]:
    """The metric names an expression selects, in order (a small reading of PromQL: strings,
    label matchers, ranges and label lists are dropped, and a word before `(` is a function)."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = []
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        word = match.group()
        if word.lower() not in PROMQL_KEYWORDS and not expr[match.end() :].lstrip().startswith("("):
            names.append(word)
    return names


def exported_names() -> set[str]:
    names = set()
    for metric in METRICS:
        if metric.kind == "histogram":
            names |= {f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count"}
        else:
            names.add(metric.name)
    return names


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def panels() -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries() -> list[str]:
    """Every PromQL expression: the panels' and the template variables' (label_values' series)."""
    out = [target["expr"] for panel in panels() for target in panel.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        out.append(match.group(1) if match else query)
    return out


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="t", le=~"$x"}[1m])))',
            ["a_bucket"],
        ),
        ('sum(foo) / on(node) group_left(stage) bar{x="sum(baz)"} offset 5m', ["foo", "bar"]),
        ("max by (node) (mohawk_up) == 1e3 and mohawk_x > bool 0.5", ["mohawk_up", "mohawk_x"]),
        ("rate(c_total[$__rate_interval])", ["c_total"]),
    ],
)
def test_metric_names_reads_promql(expr: str, names: list[str]) -> None:
    assert metric_names(expr) == names


def test_the_dashboard_is_the_provisioned_mohawk_cluster() -> None:
    board = dashboard()
    assert board["uid"] == "mohawk-cluster"
    assert board["title"] == "Mohawk cluster"
    assert board["schemaVersion"] >= 39
    assert board["refresh"] == "5s"
    assert {v["name"] for v in board["templating"]["list"]} >= {"model", "node"}


def test_every_query_charts_only_what_telemetry_exports() -> None:
    exported = exported_names()
    for expr in queries():
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = set(names) - exported
        assert not unknown, f"{sorted(unknown)} not in mohawk_telemetry METRICS: {expr!r}"


def test_every_query_reads_the_telemetry_job() -> None:
    """The gateway exports a mohawk_security_rejections_total of its own (and nodes may export
    more); reading only the telemetry job keeps the cluster's series from being counted twice."""
    job = f'{{job="{TELEMETRY_JOB}"'
    for expr in queries():
        assert len(re.findall(r"[\w:]" + re.escape(job), expr)) == len(metric_names(expr)), expr


def test_every_exported_metric_is_on_the_dashboard() -> None:
    charted = {name for expr in queries() for name in metric_names(expr)}
    for metric in METRICS:
        suffixes = ("_bucket", "_sum", "_count") if metric.kind == "histogram" else ("",)
        assert any(metric.name + suffix in charted for suffix in suffixes), metric.name


def test_histogram_quantiles_sum_their_buckets_by_le() -> None:
    quantiles = [expr for expr in queries() if "histogram_quantile" in expr]
    assert len(quantiles) >= 6  # p50, p95 and p99 of time to first token and of inter-token latency
    for expr in quantiles:
        assert re.search(r"sum by \(le\) \(rate\(\w+_bucket\{", expr), expr


def test_every_panel_reads_the_provisioned_datasource() -> None:
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "prometheus", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", {"uid": "prometheus"})["uid"] == "prometheus", panel["title"]
    for variable in dashboard()["templating"]["list"]:
        assert variable["datasource"]["uid"] == "prometheus", variable["name"]


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRAFANA_COLUMNS, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
