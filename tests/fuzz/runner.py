"""Run the CLI on corpus cases, each in a child forked from a clean server process that has already imported it (no
start-up cost per case; never a fork of pytest, whose threads could leave locks held) under an address-space limit
and a timeout.

    .venv/bin/python -m tests.fuzz [CLASS ...]     # the whole corpus (or some classes), one line per case
"""

import contextlib
import multiprocessing
import os
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.corpus import Case, cases

MEMORY_BYTES = 2 * 2**30
TIMEOUT_S = 30.0
TUNE = ("--backend", "cpu", "--strategy", "random", "--budget", "1", "--seed", "0")


@dataclass(frozen=True)
class Outcome:
    case: str
    command: str
    code: int  # exit code; -N: killed by signal N; 124: timed out
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.code in (0, 2) and len(self.stderr.strip().splitlines()) <= 1

    def __str__(self) -> str:
        first = self.stderr.strip().splitlines()[:3]
        return f"{self.case} {self.command}: exit {self.code}, {self.seconds:.1f} s, stderr {first!r}"


PRELOAD = ["onnx.reference", "onnx.shape_inference", "embed.importers.ir_json", "embed.importers.onnx_importer",
           "embed.zoo", "tunebank.cli", "transforms.search.random_search", "tests.fuzz.runner"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def preload() -> None:
    """Import what the commands import lazily, once, so that forked children do not each pay for it."""
    import onnx.reference  # noqa: F401
    import onnx.shape_inference  # noqa: F401

    import embed.importers.ir_json  # noqa: F401
    import embed.importers.onnx_importer  # noqa: F401
    import embed.zoo  # noqa: F401
    import tunebank.cli  # noqa: F401
    from transforms.search import strategies

    for name in strategies.names():
        strategies.get(name)


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def _child(argv: list[str], env: dict[str, str], out: Path) -> None:
    os.setpgid(0, 0)
    limit = _address_space() + MEMORY_BYTES  # 2 GB more than the forked parent already maps (pytest, torch, ...)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ.update(env)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        handle = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # noqa: SIM115 (not pytest's)
    code = 1
    try:
        from tunebank.cli import app

        app(args=argv, prog_name="tunebank", standalone_mode=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (the test reads the traceback from stderr)
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # type: ignore[arg-type]


def run_cli(argv: list[str], env: dict[str, str], *, timeout_s: float = TIMEOUT_S) -> tuple[int, str, str, float]:
    """``tunebank ARGV`` in a child under the caps: (exit code, stdout, stderr, seconds); 124 when it timed out."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        out = Path(tmp)
        start = time.monotonic()
        child = _context.Process(target=_child, args=(argv, env, out), daemon=False)
        child.start()
        child.join(timeout_s)
        code = 124 if child.exitcode is None else child.exitcode
        with contextlib.suppress(ProcessLookupError):  # its process group: it and the tuner's worker
            os.killpg(child.pid, signal.SIGKILL)
        child.join()
        seconds = time.monotonic() - start
        read = lambda name: (out / name).read_text(errors="replace") if (out / name).exists() else ""  # noqa: E731
        return code, read("stdout"), read("stderr"), seconds


def run_case(
    case: Case, folder: Path, data_dir: Path, commands: tuple[str, ...] = ("inspect", "tune")
) -> list[Outcome]:
    folder.mkdir(parents=True, exist_ok=True)
    model = case.write(folder) if not case.model.startswith("zoo:") else case.model
    env = {"TUNEBANK_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    outcomes = []
    for command in commands:
        argv = [command, model, *(TUNE if command == "tune" else ())]
        code, _, stderr, seconds = run_cli(argv, env)
        outcomes.append(Outcome(case.id, command, code, stderr, seconds))
    return outcomes


def main(classes: list[str]) -> int:
    preload()
    chosen = [c for c in cases() if not classes or c.klass in classes]
    failures, per_class = [], Counter(c.klass for c in chosen)
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as tmp:
        for i, case in enumerate(chosen):
            for outcome in run_case(case, Path(tmp) / str(i), Path(tmp) / "data"):
                print(("ok   " if outcome.ok else "FAIL ") + str(outcome), flush=True)
                if not outcome.ok:
                    failures.append(outcome)
    print(f"{len(chosen)} cases: " + ", ".join(f"{k} {n}" for k, n in per_class.items()))
    print(f"{len(failures)} failures")
    return 1 if failures else 0

