"""A writer process for the concurrency tests (not a test module).

    python tests/db/ingest_worker.py URL START COUNT N_SUBGRAPHS commit|hang

Measurement i is subgraph ``i % N_SUBGRAPHS`` (hash ``f"{i:064x}"``) with recipe ``tile(p0,{i // N_SUBGRAPHS})``.
``commit`` ingests in batches of 500, one transaction each, and prints the rows it inserted; ``hang`` ingests
everything in one transaction, prints ``flushed`` and waits to be killed.
"""

import sys
import time

from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.session import Database


def records(start: int, count: int, n_subgraphs: int) -> list[MeasurementIn]:
    return [
        MeasurementIn(
            f"{i % n_subgraphs:064x}", f"tile(p0,{i // n_subgraphs})", "h100", "t", 1e-6 * (1 + i % 97), 0.0, 10
        )
        for i in range(start, start + count)
    ]


def main() -> None:
    url, start, count, n_subgraphs, mode = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    database = Database(url)
    batch = records(start, count, n_subgraphs)
    if mode == "hang":
        with database.scope() as session:
            ingest_measurements(session, batch)
            session.flush()
            print("flushed", flush=True)
            time.sleep(600)
        return
    inserted = 0
    for page in range(0, len(batch), 500):
        with database.scope() as session:
            inserted += ingest_measurements(session, batch[page : page + 500]).inserted
    print(inserted, flush=True)


if __name__ == "__main__":
    main()
