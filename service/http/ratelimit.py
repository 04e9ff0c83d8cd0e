"""A token bucket per API key: ``per_minute`` requests a minute, in bursts of up to ``per_minute`` (0: no limit).

Buckets live in the process: with several API replicas each enforces the limit on its own share of the requests.
"""

import threading
import time
from collections.abc import Callable, Hashable


class RateLimiter:
    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute, self.clock = per_minute, clock
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> float:
        """Spend one request of ``key``: 0.0 when allowed, else the seconds until the next one is."""
        if self.per_minute <= 0:
            return 0.0
        rate = self.per_minute / 60.0
        with self._lock:
            now = self.clock()
            tokens, when = self._buckets.get(key, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - when) * rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return (1.0 - tokens) / rate
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
