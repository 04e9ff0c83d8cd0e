"""bench/serve_load.py's bookkeeping: percentiles, throughput and errors per route, the clients' request cycles and the
table (no timing is asserted; the load itself needs a live server)."""

from itertools import islice

import pytest

from bench.serve_load import RATE_LIMIT, cycle, markdown, summarize


def test_a_route_is_summarized_from_what_its_clients_waited_and_got() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    outcomes = ["200"] * 97 + ["500", "ReadTimeout", "429"]
    r = summarize("sqlite", "job", 32, latencies, outcomes, wall_s=4.0)
    assert (r.requests, r.throughput_rps) == (100, 25.0)
    assert r.errors == {"429": 1, "500": 1, "ReadTimeout": 1}  # every answer but a 2xx, and no answer at all
    assert (r.p50_ms, r.p99_ms, r.max_ms) == (pytest.approx(50.5), pytest.approx(99.01), 100.0)
    empty = summarize("postgresql", "search", 32, [], [], wall_s=4.0)
    assert (empty.requests, empty.p50_ms, empty.errors) == (0, None, {})
    with pytest.raises(ValueError):
        summarize("sqlite", "job", 1, [0.1], [], wall_s=1.0)


def test_each_client_starts_the_round_at_its_own_place() -> None:
    assert list(islice(cycle(["a", "b", "c"], 1), 5)) == ["b", "c", "a", "b", "c"]


def test_the_table_names_the_machine_the_commit_and_the_rate_limit() -> None:
    r = summarize("sqlite", "search", 32, [0.01, 0.02], ["200", "503"], wall_s=1.0)
    meta = {"date": "2026-11-25 02:00 UTC", "commit": "abc1234", "machine": "2 cores", "clients": 32,
            "duration_s": 10.0, "warmup_s": 2.0, "argv": "--db sqlite", "recording": "r.json", "fill": "85 subgraphs",
            "k": 5, "device_class": "cpu:x86_64", "jobs": 12}
    text = markdown([r], meta)
    assert "commit `abc1234`, 2 cores" in text and f"TUNEBANK_RATE_LIMIT_PER_MINUTE={RATE_LIMIT}" in text
    assert "| sqlite | search | 2 | 503: 1 |" in text
