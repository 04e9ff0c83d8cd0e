"""Measurements stored as they are taken, by ``tune`` (a ``transforms.tune.Recorder``) and ``optimize`` (through
``live_measurer``'s ``record``): every recipe's result, and each subgraph's eager time and baseline profile, keyed by
device and toolchain like a crawl's. A later ``optimize`` of the same subgraphs is a hit, and the crawler skips
them."""

import math
from collections.abc import Sequence

from db.repositories.baselines import set_eager_time
from db.repositories.rankings import stored_results
from db.session import Database
from embed.profile import Baseline, DeviceSpec
from embed.subgraph import Subgraph
from service.crawl import profile_vector
from service.store import add_measurements, add_profiles, add_subgraphs, register_device
from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.tune import Task


class MeasurementStore:
    """A ``Recorder`` over ``database`` for ``subgraphs`` (registered with the device on creation)."""

    def __init__(self, database: Database, device: DeviceSpec, toolchain: str, subgraphs: Sequence[Subgraph]) -> None:
        self.database, self.device, self.toolchain = database, device, toolchain
        self.subgraphs = {s.structural_hash: s for s in subgraphs if s.tunable}
        with database.scope() as session:
            self.device_id = register_device(session, device)
            self.ids = add_subgraphs(session, list(self.subgraphs.values()))
        self.stored = 0

    def register(self, subgraph: Subgraph) -> int:
        """Add ``subgraph`` (e.g. a kernel with a layout step folded into it) to what is stored; its id."""
        if subgraph.structural_hash not in self.ids:
            with self.database.scope() as session:
                self.ids |= add_subgraphs(session, [subgraph])
            self.subgraphs[subgraph.structural_hash] = subgraph
        return self.ids[subgraph.structural_hash]

    def results(self, subgraph: Subgraph) -> dict[str, float | str]:
        """What is stored for ``subgraph`` (registered first) on this device and toolchain: recipe -> median
        seconds, or the error kind of a failure."""
        subgraph_id = self.register(subgraph)
        with self.database.scope() as session:
            return stored_results(session, subgraph_id=subgraph_id, device_id=self.device_id, toolchain=self.toolchain)

    def measured(self, task: Task, recipes: Sequence[Recipe], results: Sequence[RunResult]) -> None:
        self.add(task.key, [(str(r), m) for r, m in zip(recipes, results, strict=True)])

    def add(self, key: str, results: Sequence[tuple[str, RunResult]]) -> None:
        """Store (recipe, result) pairs of the registered subgraph of structural hash ``key``."""
        with self.database.scope() as session:
            self.stored += add_measurements(session, self.device, self.toolchain, key, results)

    def baseline(self, task: Task, default_s: float, eager_s: float) -> None:
        subgraph_id = self.ids[task.key]
        with self.database.scope() as session:
            set_eager_time(session, subgraph_id=subgraph_id, device_id=self.device_id, toolchain=self.toolchain,
                           eager_s=eager_s if math.isfinite(eager_s) else None)
            if math.isfinite(default_s):
                vector = profile_vector(task, self.subgraphs[task.key], Baseline(default_s, eager_s), self.device)
                add_profiles(session, self.device_id, {subgraph_id: vector})
