"""The registry's lazy entries under concurrent first lookups (the HTTP server's threads look up encoders at once)."""

import sys
import threading
from pathlib import Path

import pytest

from embed.registry import Registry


def test_threads_looking_up_a_lazy_entry_at_once_all_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slow_entry_module.py").write_text("import time\ntime.sleep(0.3)  # a slow import\nENTRY = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_entry_module", raising=False)
    registry: Registry[int] = Registry("thing")
    registry.register_lazy("slow", "slow_entry_module:ENTRY")
    found: list[object] = []

    def look_up() -> None:
        try:
            found.append(registry.get("slow"))
        except Exception as e:  # noqa: BLE001 (collected and asserted below)
            found.append(e)

    threads = [threading.Thread(target=look_up) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # before: the first thread took the entry off the lazy list while it imported, and the others were told
    # "unknown thing 'slow'" (the HTTP search answered 500 so, under load)
    assert found == [42] * 8
    assert registry.names() == ["slow"]
