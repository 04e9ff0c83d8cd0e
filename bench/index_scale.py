"""Vector index at scale: build time, memory, p50/p99 single-query latency and recall@10 against exact search.

    .venv/bin/python bench/index_scale.py --n 1000000 --out bench/results/index_scale.md

Vectors are random, 128-d, fixed seed: ``--data random`` draws them from a standard normal (no structure: the hard
case for approximate search), ``--data clustered`` around 10,000 random centres (structure like that of real
embeddings, which gather by subgraph family). Queries come from the same distribution and are not in the set.
Each index is built with ``db.index.factory.new_index`` (the code path the service uses) with all cores, then
queried one vector at a time on one thread, as one request would be, under each search parameter string.
``--append`` adds the run as a section to an existing results file.
"""

import argparse
import datetime as dt
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from db.index.factory import Metric, new_index, set_search_params

SWEEPS: dict[str, list[str]] = {
    "Flat": [""],
    "HNSW32": ["efSearch=64", "efSearch=128", "efSearch=256", "efSearch=512", "efSearch=1024", "efSearch=4096"],
    "IVF1024,PQ32": ["nprobe=16", "nprobe=64"],
    "IVF1024,PQ32,RFlat": ["nprobe=16,k_factor_rf=8", "nprobe=64,k_factor_rf=32"],
}


@dataclass(frozen=True)
class Row:
    factory: str
    params: str
    build_s: float
    memory_mb: float
    p50_ms: float
    p99_ms: float
    recall: float


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def device() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{os.cpu_count()}-core {platform.machine()} ({model})"


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    hits = sum(len(set(f[:k]) & set(t[:k])) for f, t in zip(found, truth, strict=True))
    return hits / (k * len(truth))


def bench_factory(factory: str, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int) -> list[Row]:
    before = rss_mb()
    start = time.perf_counter()
    index = new_index(factory, data.shape[1], Metric.L2)
    if not index.is_trained:
        sample = data[np.random.default_rng(1).choice(len(data), size=min(len(data), 100_000), replace=False)]
        index.train(sample)
    index.add_with_ids(data, np.arange(len(data), dtype=np.int64))
    build_s = time.perf_counter() - start
    memory_mb = rss_mb() - before
    n_timed = 200 if factory == "Flat" else len(queries)
    rows = []
    for params in SWEEPS.get(factory, [""]):
        set_search_params(index, params)
        found = np.empty((len(queries), k), dtype=np.int64)
        latencies = []
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        for i, q in enumerate(queries[:n_timed]):
            t0 = time.perf_counter()
            _, ids = index.search(q[None, :], k)
            latencies.append(time.perf_counter() - t0)
            found[i] = ids[0]
        faiss.omp_set_num_threads(threads)
        if n_timed < len(queries):
            found[n_timed:] = index.search(queries[n_timed:], k)[1]
        ms = np.array(latencies) * 1e3
        rows.append(
            Row(
                factory,
                params or "-",
                build_s,
                memory_mb,
                float(np.percentile(ms, 50)),
                float(np.percentile(ms, 99)),
                recall_at(found, truth, k),
            )
        )
        print(rows[-1], flush=True)
    del index
    return rows


def make_data(kind: str, n: int, n_queries: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if kind == "random":
        return rng.standard_normal((n, dim), dtype=np.float32), rng.standard_normal((n_queries, dim), dtype=np.float32)
    centres = rng.standard_normal((10_000, dim), dtype=np.float32)

    def draw(count: int) -> np.ndarray:
        return centres[rng.integers(len(centres), size=count)] + 0.25 * rng.standard_normal(
            (count, dim), dtype=np.float32
        )

    return draw(n), draw(n_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--factories", default=";".join(SWEEPS), help="';'-separated factory strings")
    parser.add_argument("--data", choices=["random", "clustered"], default="random")
    parser.add_argument("--out", type=Path, default=None, help="markdown file for the results")
    parser.add_argument("--append", action="store_true", help="add a section to --out instead of replacing it")
    args = parser.parse_args()
    factories = args.factories.split(";")
    load_at_start = os.getloadavg()[0]
    data, queries = make_data(args.data, args.n, args.queries, args.dim)
    exact = faiss.IndexFlatL2(args.dim)
    exact.add(data)
    truth = exact.search(queries, args.k)[1]
    del exact
    rows = [row for factory in factories for row in bench_factory(factory, data, queries, truth, args.k)]
    lines = [
        f"## {args.n:,} x {args.dim}-d {args.data} vectors, L2",
        "",
        f"- device: {device()}, FAISS {faiss.__version__}; built on {faiss.omp_get_max_threads()} OpenMP threads",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; load average {load_at_start:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end (other work shares this machine)",
        f"- {args.queries} queries, one at a time on one thread; recall@{args.k} against exact search "
        "(Flat latency from the first 200 queries)",
        "- memory: resident-set growth while building the index",
        "",
        f"| factory | search params | build s | memory MB | p50 ms | p99 ms | recall@{args.k} |",
        "|---|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r.factory} | {r.params} | {r.build_s:.1f} | {r.memory_mb:.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} "
            f"| {r.recall:.3f} |"
            for r in rows
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out and args.append and args.out.exists():
        args.out.write_text(args.out.read_text() + "\n" + text)
    elif args.out:
        args.out.write_text("# Vector index at scale\n\n" + text)


if __name__ == "__main__":
    main()
