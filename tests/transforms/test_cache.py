"""The kernel cache is verified: a digest beside each artifact, broken entries rebuilt (never a failed compile),
replaced libraries never loaded, killed builds' folders removed, folders private."""

import ctypes
import os
import stat
import subprocess
from pathlib import Path

import pytest

from transforms.compilers import cache, cpu

ADD_ONE = "int add_one(int x) { return x + 1; }"


def _works(artifact: str) -> bool:
    library = cpu.load(artifact)
    library.add_one.restype = ctypes.c_int
    return library.add_one(41) == 42


BREAKS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "empty": lambda p: p.write_bytes(b""),
    "replaced": lambda p: p.write_bytes(Path(cpu.compile_c("int other(void) { return 7; }", cache_dir=p.parent.parent)
                                             .artifact).read_bytes()),
    "no digest": lambda p: p.with_name(p.name + ".sha256").unlink(),
    "digest is a folder": lambda p: (p.with_name(p.name + ".sha256").unlink(), p.with_name(p.name + ".sha256").mkdir()),
    "artifact is a folder": lambda p: (p.unlink(), p.mkdir()),
}


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_broken_entry_is_rebuilt_not_a_failure(tmp_path: Path, how: str) -> None:
    first = cpu.compile_c(ADD_ONE, cache_dir=tmp_path)
    artifact = Path(first.artifact)
    BREAKS[how](artifact)
    assert not cache.verified(artifact)
    again = cpu.compile_c(ADD_ONE, cache_dir=tmp_path)
    assert again.ok and not again.cached and again.artifact == first.artifact
    assert cache.verified(artifact) and _works(again.artifact)
    assert cpu.compile_c(ADD_ONE, cache_dir=tmp_path).cached


def test_a_library_replaced_after_its_build_is_never_loaded(tmp_path: Path) -> None:
    artifact = Path(cpu.compile_c(ADD_ONE, cache_dir=tmp_path).artifact)
    other = Path(cpu.compile_c("int add_one(int x) { return x + 2; }", cache_dir=tmp_path).artifact)
    artifact.write_bytes(other.read_bytes())
    with pytest.raises(OSError, match="does not match the digest"):
        cpu.load(str(artifact))


def test_build_folders_of_dead_processes_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / "cpu"
    folder.mkdir(parents=True)
    (folder / f"build-{dead.pid}-abc").mkdir()
    (folder / f"build-{dead.pid}-abc" / "kernel.c").write_text("half written")
    (folder / f"build-{os.getpid()}-live").mkdir()  # a build in progress in a live process
    monkeypatch.setattr(cache, "_swept", set())
    assert cpu.compile_c(ADD_ONE, cache_dir=tmp_path).ok
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("build-"))
    assert left == [f"build-{os.getpid()}-live"]


def test_cache_folders_are_private(tmp_path: Path) -> None:
    cache_dir = tmp_path / "kernels"
    cache_dir.mkdir(mode=0o755)
    cache_dir.chmod(0o755)
    assert cpu.compile_c(ADD_ONE, cache_dir=cache_dir).ok
    for folder in (cache_dir, cache_dir / "cpu"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
