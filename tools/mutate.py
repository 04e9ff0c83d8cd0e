"""Planted bugs, one at a time: how strong the test suite is where a wrong answer costs most.

    .venv/bin/python tools/mutate.py [--worktree] [NAME_SUBSTRING ...]     (or: make mutate)

Each mutant of :data:`MUTANTS` (tools/mutants.py) replaces one exact text of one file with a wrong variant. The
files of the last commit (``--worktree``: of the working tree, uncommitted edits included) are copied once to a
temporary folder; each mutant is applied there, the tests it names are run (``pytest -x``; pytest-timeout ends a
test that spins), and the file is restored. A mutant is killed when those tests fail (or time out), survived when
they pass; each set of tests must pass on the unmutated copy first. Prints one line per mutant, then killed /
total and the kill rate; exits 1 below :data:`TARGET`. Not part of ``make test``.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants import MUTANTS, Mutant  # noqa: E402 (beside this script, not a package)

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.95
TIMEOUT_S = 900  # a whole pytest run of one mutant
TEST_TIMEOUT_S = 120  # one test of it (pytest-timeout): a mutant that makes a loop spin is killed this way


def copy_tree(target: Path, *, worktree: bool = False) -> None:
    """The last commit's files into ``target``; with ``worktree``, the working tree's (tracked, and untracked ones
    git does not ignore), uncommitted edits included."""
    if not worktree:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    for name in (f for f in listed.split("\0") if f and (ROOT / f).is_file()):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)


def pytest(tree: Path, tests: tuple[str, ...]) -> tuple[int | None, str]:
    """(pytest's exit status, or None when the whole run timed out; the end of its output)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               f"--timeout={TEST_TIMEOUT_S}", *tests], cwd=tree, env=env, capture_output=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, (done.stdout.decode() + done.stderr.decode())[-3000:]


def run_mutant(tree: Path, mutant: Mutant) -> tuple[str, float]:
    """("killed" | "survived" | "killed (timeout)" | "error ...", seconds); the file is restored afterwards."""
    path = tree / mutant.path
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name!r}: {mutant.old!r} occurs {original.count(mutant.old)} times in "
                         f"{mutant.path}, not once; update tools/mutants.py")
    path.write_text(original.replace(mutant.old, mutant.new))
    started = time.perf_counter()
    try:
        status, output = pytest(tree, mutant.tests)
    finally:
        path.write_text(original)
    if status is None:
        outcome = "killed (timeout)"
    elif status in (0, 1):
        outcome = "survived" if status == 0 else "killed"
    else:  # 2..5: interrupted, internal or usage error, no tests collected: not a kill
        outcome = f"error (pytest exit {status})"
        sys.stderr.write(output)
    return outcome, time.perf_counter() - started


def main(args: list[str]) -> int:
    worktree = "--worktree" in args
    filters = [a for a in args if a != "--worktree"]
    chosen = [m for m in MUTANTS if not filters or any(f in m.name for f in filters)]
    with tempfile.TemporaryDirectory(prefix="tunebank-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, worktree=worktree)
        for tests in dict.fromkeys(m.tests for m in chosen):  # a kill means something only where these pass
            status, output = pytest(tree, tests)
            if status != 0:
                print(output, file=sys.stderr)
                raise SystemExit(f"the tests {' '.join(tests)} fail without any mutant (exit {status}): fix them first")
        killed = 0
        for i, mutant in enumerate(chosen, 1):
            outcome, seconds = run_mutant(tree, mutant)
            killed += outcome.startswith("killed")
            print(f"[{i:>2}/{len(chosen)}] {outcome:<16} {seconds:6.1f} s  {mutant.name}: {mutant.why}", flush=True)
    rate = killed / len(chosen) if chosen else 1.0
    print(f"killed {killed} / {len(chosen)} ({rate:.0%}); survived {len(chosen) - killed}")
    return 0 if rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
