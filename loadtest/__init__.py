"""The many-users load test: N concurrent sessions and M plain streaming chat clients of
several tenants against one cluster, measured token by token.

`python -m loadtest` starts a redis-server and a 1-node local cluster with auth on (or drives a
running one with `--url` and `--redis-url`), creates the tenants, runs the load, prints the report's
table, writes it as JSON and a PNG, and exits non-zero when an acceptance check fails.

spec.py      what to run: counts, tokens, tenants and their quotas
driver.py    the clients: sessions and chat loops over one httpx.AsyncClient
stream.py    one generation request: 429s honoured and retried, errors classified, tokens timed
measure.py   what the clients record: one `RequestLog` per request, refusals by tenant
loop_lag.py  the generator's own event-loop lag, sampled while the load runs
memory.py    RSS of the cluster's processes, sampled every 0.5 s
stats.py     percentiles, per-second buckets, the all-busy window and token shares
report.py    the JSON report and the acceptance checks
table.py     the report's markdown tables
plot.py      the PNG: latency percentiles and tokens/s by tenant over time
target.py    the cluster under test: started here or given, its tenants, the warm-up
run.py       one whole run, from target to report (what the CLI and the test call)
cli.py       the command line
"""
