"""Measurement ingest throughput into SQLite and PostgreSQL from one process.

    PYTHONPATH=. .venv/bin/python bench/db_ingest.py --n 200000 --out bench/results/db_ingest.md

Each batch is one call of ``ingest_measurements`` in its own transaction (as one ``POST /v1/measurements`` would be).
The same rows are then sent again to time the idempotent path (every row a duplicate, nothing stored twice).
PostgreSQL runs in a fresh schema that is dropped afterwards; SQLite in a fresh file.
"""

import argparse
import datetime as dt
import os
import platform
import secrets
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from sqlalchemy import func, select, text

from db.migrate import upgrade
from db.models import Measurement
from db.repositories.devices import DeviceIn, upsert_device
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.subgraphs import SubgraphIn, add_subgraphs
from db.session import Database

PG_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def records(n: int, n_subgraphs: int) -> list[MeasurementIn]:
    return [
        MeasurementIn(f"{i % n_subgraphs:064x}", f"tile(p0,{i // n_subgraphs});vectorize(p0,4)", "h100",
                      "cuda-13.0/cupy-14.2/nvrtc-13.0", 1e-6 * (1 + i % 997), 1e-8, 100)
        for i in range(n)
    ]  # fmt: skip


def run(database: Database, batch: list[MeasurementIn], batch_size: int, n_subgraphs: int) -> tuple[float, float]:
    upgrade(database.engine)
    with database.scope() as session:
        upsert_device(session, DeviceIn("h100", "cuda:sm_90", "sm_90"))
        add_subgraphs(session, [SubgraphIn(f"{i:064x}", "f" * 64, "pointwise", "{}") for i in range(n_subgraphs)])
    rates = []
    for expected in (len(batch), 0):
        start, inserted = time.perf_counter(), 0
        for page in range(0, len(batch), batch_size):
            with database.scope() as session:
                inserted += ingest_measurements(session, batch[page : page + batch_size]).inserted
        rates.append(len(batch) / (time.perf_counter() - start))
        assert inserted == expected, (inserted, expected)
    with database.scope() as session:
        assert session.scalar(select(func.count()).select_from(Measurement)) == len(batch)
    return rates[0], rates[1]


def device() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{os.cpu_count()}-core {platform.machine()} ({model})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--subgraphs", type=int, default=1_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    batch = records(args.n, args.subgraphs)
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        database = Database(f"sqlite:///{tmp}/bench.db")
        results[f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=NORMAL)"] = run(
            database, batch, args.batch, args.subgraphs
        )
        database.dispose()
    schema = f"tb_bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        database = Database(f"{PG_SERVER}?options=-csearch_path%3D{schema}")
        with database.engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar()
        results[f"PostgreSQL {version} (psycopg {psycopg.__version__})"] = run(
            database, batch, args.batch, args.subgraphs
        )
        database.dispose()
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    lines = [
        f"# Measurement ingest ({args.n:,} measurements, batches of {args.batch:,}, one process)",
        "",
        f"- device: {device()}",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; load average {load_at_start:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end (other work shares this machine)",
        "- each batch: one `ingest_measurements` call in its own transaction: recipes upserted, keys resolved, rows",
        "  inserted with `ON CONFLICT DO NOTHING` (SQLite: multi-row INSERT ... RETURNING; PostgreSQL: COPY into a",
        "  temporary staging table, then INSERT ... SELECT); the resend sends every row again (all duplicates)",
        "- targets: 20,000/s into PostgreSQL, 5,000/s into SQLite",
        "",
        "| backend | new rows/s | resent duplicates/s |",
        "|---|---:|---:|",
        *(f"| {name} | {new:,.0f} | {dup:,.0f} |" for name, (new, dup) in results.items()),
    ]
    text_out = "\n".join(lines) + "\n"
    print(text_out)
    if args.out:
        args.out.write_text(text_out)


if __name__ == "__main__":
    main()
