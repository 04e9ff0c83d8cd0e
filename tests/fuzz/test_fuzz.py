"""The hostile corpus through ``tunebank inspect`` and ``tunebank tune --backend cpu``: every case exits 0 or 2 with
at most one line on stderr, within 30 s and 2 GB of address space beyond what the forked parent maps.

The suite runs every case (about 300, 2 minutes on an idle 2-core machine); ``FUZZ_SAMPLE=1`` runs a sample of each
class instead (the first case and two spread over the rest, without the 20k-node graphs), for a quick local run;
``python -m tests.fuzz`` runs them outside pytest and prints one line each.
"""

import os
from pathlib import Path

import pytest

from tests.fuzz.corpus import CLASSES, Case, cases
from tests.fuzz.runner import preload, run_case

PER_CLASS = 3
ACCEPTED = {"files/valid", "external_data/beside", "external_data/subfolder"}  # must exit 0: not refused
SKIP_IN_SAMPLE = {"big_graphs/chain-20k", "big_graphs/inputs-20k-shared-prefix", "big_graphs/json-chain-20k"}


def _sample(all_cases: list[Case]) -> list[Case]:
    chosen = []
    for klass in CLASSES:
        members = [c for c in all_cases if c.klass == klass and c.id not in SKIP_IN_SAMPLE]
        step = max(len(members) // PER_CLASS, 1)
        chosen += members[::step][:PER_CLASS]
    return chosen + [c for c in all_cases if c.id in ACCEPTED and c not in chosen]


CORPUS = cases()
CHOSEN = _sample(CORPUS) if os.environ.get("FUZZ_SAMPLE") else CORPUS


def test_the_corpus_covers_every_class_with_at_least_250_cases() -> None:
    assert len(CORPUS) >= 250
    assert {c.klass for c in CORPUS} == set(CLASSES)
    assert len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    preload()
    return tmp_path_factory.mktemp("fuzz-data")


@pytest.mark.parametrize("case", CHOSEN, ids=lambda c: c.id.encode("unicode_escape").decode())
def test_case_exits_0_or_2_with_at_most_one_line(case: Case, tmp_path: Path, data_dir: Path) -> None:
    for outcome in run_case(case, tmp_path / "case", data_dir):
        assert outcome.ok, str(outcome)
        assert outcome.code == 0 or case.id not in ACCEPTED, str(outcome)
