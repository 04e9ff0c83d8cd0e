"""A tunebank database filled from a ``tunebank bench transfer`` recording, with no kernel run.

    PYTHONPATH=. .venv/bin/python bench/db_from_recording.py bench/results/transfer_h200.json /tmp/h200.db
    PYTHONPATH=. .venv/bin/python bench/db_from_recording.py bench/results/transfer_strong_h100.json /tmp/h100.db \
        --models bert_encoder-h512-s128-b4,gpt_decoder-h768-s128-b2   # some of the recording's models
    PYTHONPATH=. .venv/bin/python bench/db_from_recording.py bench/results/transfer_h200.json \
        'postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dh200'   # an empty schema

The crawler (``service.crawl.crawl``) runs over the recording's models with the recording's search strategy,
budget and seed, measuring through a replay of the recording: every recipe it tries (the search, the cross
table) was measured on the recording's device, so the database holds what a crawl on that device would have
stored. ``bench/gpu_table.py --db`` then transfers from it to the benchmark's shapes, which no zoo model there has.
"""

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from db.migrate import upgrade
from db.session import Database
from embed.partition import partition
from service.bench_transfer import load_graph
from service.crawl import CrawlReport, crawl
from service.measure import MeasurementTable, Measurer


def build(recording: dict, target: Path | str, models: Sequence[str] | None = None) -> tuple[CrawlReport, str]:
    """Crawl the recording's models (or those of them named in ``models``, as the recording names them) into
    ``target``, a new SQLite file or a database URL (an empty database or schema); (the crawl's report, the device
    name)."""
    config = recording["config"]
    unknown = sorted(set(models or ()) - set(config["models"]))
    if unknown:
        raise ValueError(f"not models of the recording: {', '.join(unknown)}; it has {', '.join(config['models'])}")
    measurer = Measurer(MeasurementTable.from_json(recording["measurements"]))
    chosen = [spec for spec in config["models"] if models is None or spec in models]
    subgraphs = [s for spec in chosen for s in partition(load_graph(spec))]
    database = Database(_url(target))
    try:
        upgrade(database.engine)
        report = crawl(database, subgraphs, measurer, backend=config["backend"], strategy=config["strategy"],
                       budget=config["budget"], seed=config["seed"])
    finally:
        database.dispose()
    return report, measurer.table.device.name


def _url(target: Path | str) -> str:
    return str(target) if "://" in str(target) else f"sqlite:///{target}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recording", type=Path, help="JSON report or checkpoint of tunebank bench transfer")
    p.add_argument("database", help="SQLite file to create (must not exist), or a database URL")
    p.add_argument("--models", help="comma-separated: only these of the recording's models (default: all)")
    args = p.parse_args()
    if "://" not in args.database and Path(args.database).exists():
        p.error(f"{args.database} exists; choose a new file")
    try:
        report, device = build(json.loads(args.recording.read_text()), args.database,
                               args.models.split(",") if args.models else None)
    except ValueError as e:
        p.error(str(e))
    print(f"{args.database}: {report.subgraphs} subgraphs, {report.measurements} measurements "
          f"({report.cross_applications} cross-applications) on {device}")


if __name__ == "__main__":
    main()
