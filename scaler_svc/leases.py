"""Liveness leases of the Launch calls a scaler is running (nitro.contracts.launch_owner_key).

An invocation's record names the Launch running it (nitro.launches); its lease tells a retried Launch and a
resumed learner whether anyone still runs it. One daemon thread refreshes every held lease, and only while
some are held. A scaler that dies stops refreshing, so its leases lapse within the TTL: its running
invocations then count as lost. (On AWS a Lambda may outlive the scaler: a batch it sends still counts for
its round while the round is open, and is dropped as stale after.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from nitro.contracts import LAUNCH_LEASE_REFRESH_S, LAUNCH_LEASE_TTL_S

log = logging.getLogger(__name__)


class LaunchLeases:
    def __init__(self, redis_client, *, ttl_s: float = LAUNCH_LEASE_TTL_S, refresh_s: float = LAUNCH_LEASE_REFRESH_S):
        self.redis, self.ttl_ms, self.refresh_s = redis_client, max(1, round(ttl_s * 1000)), refresh_s
        self._held: Counter[str] = Counter()  # a key may be held twice at once
        self._lock = threading.Lock()  # writes happen under it: a released lease is never written again
        self._refresher: threading.Thread | None = None

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Keep `key` alive while the block runs; delete it when the last holder leaves."""
        with self._lock:
            self._held[key] += 1
            self._write([key])
            if self._refresher is None:
                self._refresher = threading.Thread(target=self._refresh, name="wave-leases", daemon=True)
                self._refresher.start()
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]
                    self._quietly(lambda: self.redis.delete(key), "release")

    def _refresh(self) -> None:
        while True:
            time.sleep(self.refresh_s)
            with self._lock:
                if not self._held:
                    self._refresher = None
                    return
                self._write(list(self._held))

    def _write(self, keys: list[str]) -> None:
        def set_all():
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, 1, px=self.ttl_ms)
            pipe.execute()

        self._quietly(set_all, "refresh")

    @staticmethod
    def _quietly(fn, what: str) -> None:
        """A lease is advice: a Redis error must not fail the launch (an unrefreshed lease just lapses)."""
        try:
            fn()
        except redis.RedisError as exc:
            log.warning("launch lease %s failed: %s", what, exc)
