"""Load on a live ``tunebank serve``: concurrent clients (32 by default) on ``POST /v1/search`` and
``GET /v1/jobs/{id}``, over the embedded default (SQLite) and over PostgreSQL, each database filled first.

    PYTHONPATH=. .venv/bin/python bench/serve_load.py --db sqlite,postgresql --out bench/results/serve_load

Per database: a fresh data folder (for PostgreSQL also a new schema in ``--postgres``'s database, dropped at the end);
the crawl of ``--recording`` replayed into it (``bench/db_from_recording.py``: no kernel runs); the static encoder
fitted on the recording's device and promoted (what searches use); one API key with the read and optimize scopes;
one optimize job per recording model sent through ``POST /v1/optimize`` with the executor ``none``, so the jobs stay
queued, as a job a client polls is. Then ``tunebank serve`` runs in a process of its own with
``TUNEBANK_RATE_LIMIT_PER_MINUTE`` set to :data:`RATE_LIMIT` (the limiter still counts every request, and never
refuses one). Each route is loaded on its own: ``--warmup`` seconds not counted, then ``--duration`` seconds in which
every client sends its next request as soon as its last one was answered (one asyncio loop, httpx). Latency is
what the client waited; an error is an answer other than 2xx, or none. The server and the clients share this
machine's cores: the figures are those of both on it.
"""

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RATE_LIMIT = 10_000_000  # requests a minute per key: far above what this load sends
ROUTES = ("job", "search")  # job status first: a search that wedges the server leaves it wedged
REQUEST_TIMEOUT_S = 10.0  # a request unanswered by then is an error (ReadTimeout)


@dataclass(frozen=True)
class RouteResult:
    database: str
    route: str
    clients: int
    requests: int
    errors: dict[str, int]
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    throughput_rps: float
    wall_s: float


def summarize(database: str, route: str, clients: int, latencies_s: list[float], outcomes: list[str],
              wall_s: float) -> RouteResult:
    """One route's figures: latency percentiles over every answered request (errors included: a slow 500 is slow
    too), throughput over the measured wall time, and errors by status (or exception name) for non-2xx outcomes."""
    if len(latencies_s) != len(outcomes):
        raise ValueError("one outcome per request")
    errors = dict(sorted(Counter(o for o in outcomes if not o.startswith("2")).items()))
    ms = np.asarray(latencies_s, dtype=float) * 1e3

    def pct(q: float) -> float | None:
        return round(float(np.percentile(ms, q)), 2) if len(ms) else None

    return RouteResult(database, route, clients, len(outcomes), errors, pct(50), pct(90), pct(99),
                       round(float(ms.max()), 2) if len(ms) else None,
                       round(len(outcomes) / wall_s, 1) if wall_s > 0 else 0.0, round(wall_s, 2))


async def load(url: str, key: str, requests: Callable[[int], Iterator[tuple[str, str, dict | None]]], *,
               clients: int, duration_s: float, warmup_s: float) -> tuple[list[float], list[str], float]:
    """``clients`` loops, each sending the requests ``requests(client_number)`` yields (method, path, JSON body)
    back to back; what was answered after the warm-up and before its end: (latencies, outcomes, wall seconds)."""
    latencies: list[float] = []
    outcomes: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=REQUEST_TIMEOUT_S,
                                 limits=limits) as http:
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + duration_s

        async def client(n: int) -> None:
            for method, path, body in requests(n):
                sent = time.perf_counter()
                if sent >= stop_at:
                    return
                try:
                    response = await http.request(method, path, json=body)
                    outcome = str(response.status_code)
                except httpx.HTTPError as e:
                    outcome = type(e).__name__
                answered = time.perf_counter()
                if sent >= measure_from and (answered <= stop_at or outcome == "ReadTimeout"):
                    latencies.append(answered - sent)
                    outcomes.append(outcome)

        await asyncio.gather(*(client(n) for n in range(clients)))
    return latencies, outcomes, duration_s


def cycle(items: list, offset: int) -> Iterator:
    """``items`` round and round, starting at ``offset`` (each client at its own place)."""
    n = offset
    while True:
        yield items[n % len(items)]
        n += 1


def markdown(results: list[RouteResult], meta: dict) -> str:
    lines = [f"# `tunebank serve` under load: {', '.join(sorted({r.database for r in results}))}", "",
             f"{meta['date']}, commit `{meta['commit']}`, {meta['machine']}. {meta['clients']} concurrent clients "
             f"per route, {meta['duration_s']:g} s each after {meta['warmup_s']:g} s of warm-up; "
             f"`bench/serve_load.py {meta['argv']}`.", "",
             f"Database: the crawl of `{meta['recording']}` replayed ({meta['fill']}). Search: `POST /v1/search` by a "
             f"stored subgraph's hash, k={meta['k']}, device class `{meta['device_class']}`, round robin over the "
             f"stored subgraphs. Job status: `GET /v1/jobs/{{id}}` round robin over {meta['jobs']} queued jobs of the "
             f"key. Rate limit: `TUNEBANK_RATE_LIMIT_PER_MINUTE={RATE_LIMIT}` (the limiter runs, never refuses).", "",
             "| database | route | requests | errors | p50 ms | p90 ms | p99 ms | max ms | req/s |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        errors = ", ".join(f"{k}: {v}" for k, v in r.errors.items()) or "0"
        lines.append(f"| {r.database} | {r.route} | {r.requests} | {errors} | {r.p50_ms} | {r.p90_ms} | {r.p99_ms} "
                     f"| {r.max_ms} | {r.throughput_rps} |")
    return "\n".join(lines) + "\n"


# -- setting up a served database -------------------------------------------------------------------------------

def _tunebank(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tunebank", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"tunebank {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout


@contextmanager
def postgres_schema(server_url: str) -> Iterator[str]:
    """A new schema in ``server_url``'s database, dropped afterwards; the URL that uses it."""
    from sqlalchemy import create_engine, text

    schema = f"tb_serve_load_{os.getpid()}_{secrets.token_hex(3)}"
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield f"{server_url}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()


def fill(recording: dict, url: str, data_dir: Path) -> tuple[str, str, list[str]]:
    """The recording's crawl in ``url``, the static encoder promoted; (fill summary, device class, stored hashes)."""
    from sqlalchemy import select

    from bench.db_from_recording import build
    from db.models import Device, Subgraph
    from db.session import Database
    from service.embeddings import EncoderStore, embed_subgraphs, fit_encoder, profiled_subgraphs

    report, device = build(recording, url)
    database = Database(url)
    try:
        with database.scope() as session:
            device_id, device_class = session.execute(select(Device.id, Device.device_class)
                                                      .where(Device.name == device)).one()
            ids = profiled_subgraphs(session, device_id)
            encoder = fit_encoder(session, "static", device_id=device_id, subgraph_ids=ids,
                                  backend=recording["config"]["backend"])
            embed_subgraphs(session, encoder, device_id=device_id, subgraph_ids=ids)
            hashes = list(session.scalars(select(Subgraph.structural_hash).where(Subgraph.id.in_(ids))
                                          .order_by(Subgraph.id)))
    finally:
        database.dispose()
    store = EncoderStore(data_dir / "encoders")
    store.save(encoder)
    store.promote("static", encoder.version)
    summary = (f"{report.subgraphs} subgraphs, {report.measurements} measurements on {device}, "
               f"{len(ids)} embedded with the static encoder")
    return summary, str(device_class), hashes


@contextmanager
def serving(env: dict[str, str]) -> Iterator[str]:
    from tests.tunebank.conftest import running_server  # the tests' way of starting and stopping a server

    with running_server(env, "--executor", "none") as url:
        yield url


def submit_jobs(url: str, key: str, models: list[str], device_class: str) -> list[int]:
    from embed import zoo

    ids = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        for spec in models:
            document = zoo.load(spec).to_json().encode()
            answer = http.post("/v1/optimize", files={"model": (f"{spec}.json", document)},
                               data={"device_class": device_class})
            answer.raise_for_status()
            ids.append(int(answer.json()["job_id"]))
    return ids


def run_database(kind: str, args: argparse.Namespace, recording: dict) -> tuple[list[RouteResult], dict]:
    with tempfile.TemporaryDirectory(prefix=f"serve_load_{kind}_") as folder, \
            (postgres_schema(args.postgres) if kind == "postgresql" else _nothing()) as pg_url:
        data = Path(folder)
        url = pg_url or f"sqlite:///{data / 'tunebank.db'}"
        started = time.perf_counter()
        summary, device_class, hashes = fill(recording, url, data)
        fill_s = time.perf_counter() - started
        env = {**os.environ, "TUNEBANK_DATA_DIR": str(data), "TUNEBANK_RATE_LIMIT_PER_MINUTE": str(RATE_LIMIT),
               "TUNEBANK_BACKEND": "cpu", **({"TUNEBANK_DATABASE_URL": pg_url} if pg_url else {})}
        key = _tunebank(env, "keys", "create", "--scopes", "read,optimize", "--name", "load").splitlines()[1]
        with serving(env) as server:
            jobs = submit_jobs(server, key, recording["config"]["models"], device_class)
            searches = [("POST", "/v1/search", {"subgraph": h, "device_class": device_class, "k": args.k})
                        for h in hashes]
            polls = [("GET", f"/v1/jobs/{j}", None) for j in jobs]
            results = []
            for route, requests in (("job", polls), ("search", searches)):
                if route not in args.routes:
                    continue
                measured = asyncio.run(load(server, key, lambda n, r=requests: cycle(r, n), clients=args.clients,
                                            duration_s=args.duration, warmup_s=args.warmup))
                results.append(summarize(kind, route, args.clients, *measured))
                print(results[-1], flush=True)
    meta = {"fill": f"{summary}; filled in {fill_s:.0f} s", "device_class": device_class, "jobs": len(jobs)}
    return results, meta


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "bench/serve_load.py"], cwd=ROOT).returncode
    return done.stdout.strip() + ("+serve_load.py edits" if dirty else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    p.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                   help="PostgreSQL database to make a temporary schema in")
    p.add_argument("--recording", type=Path, default=ROOT / "bench/results/transfer_cpu.json",
                   help="a tunebank bench transfer recording whose recipe space is this commit's (the cpu one is)")
    p.add_argument("--routes", default="job,search", help="comma-separated: job, search")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per route")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds per route before measuring")
    p.add_argument("--k", type=int, default=5, help="neighbours per search")
    p.add_argument("--out", type=Path, help="write OUT_<db>.md and OUT_<db>.json")
    args = p.parse_args()
    args.routes = [r for r in args.routes.split(",") if r]
    if unknown := set(args.routes) - set(ROUTES):
        p.error(f"unknown route {sorted(unknown)[0]!r}; choose from {', '.join(ROUTES)}")
    recording = json.loads(args.recording.read_text())
    for kind in [d for d in args.db.split(",") if d]:
        if kind not in ("sqlite", "postgresql"):
            p.error(f"unknown database {kind!r}; choose sqlite or postgresql")
        results, filled = run_database(kind, args, recording)
        meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": _commit(),
                "machine": f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), this "
                           "development machine, shared with other work", "clients": args.clients,
                "duration_s": args.duration, "warmup_s": args.warmup, "k": args.k,
                "recording": str(args.recording.resolve().relative_to(ROOT)) if args.recording.resolve()
                .is_relative_to(ROOT) else str(args.recording), "argv": " ".join(sys.argv[1:]), **filled}
        print(markdown(results, meta))
        if args.out is not None:
            base = args.out.with_name(f"{args.out.name}_{kind}")
            base.with_suffix(".md").write_text(markdown(results, meta))
            base.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]},
                                                            indent=1) + "\n")


if __name__ == "__main__":
    main()
