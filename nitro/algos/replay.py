"""A bounded buffer of recent actor batches for off-policy replay (IMPACT's circular buffer).

The asynchronous learner updates whenever fresh batches arrive; when the stream is
momentarily empty it replays batches from here instead of idling (paper section 4,
off-policy mode). Pure data structure: no torch, no Redis, batches kept by reference.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from nitro.errors import ConfigError


class ReplayBuffer:
    """The `capacity` most recent batches, each replayable at most `max_reuse` times.

    `add` stores a fresh batch (evicting the oldest beyond capacity); `sample(n)` hands
    out up to n distinct stored batches chosen uniformly at random and drops those that
    reached `max_reuse` replays. capacity 0 disables replay (sample returns []).
    """

    def __init__(self, capacity: int, max_reuse: int = 1, seed: int = 0):
        if capacity < 0:
            raise ConfigError(f"invalid value for replay capacity: must be an integer >= 0, got {capacity!r}")
        if max_reuse < 1:
            raise ConfigError(f"invalid value for replay max_reuse: must be an integer >= 1, got {max_reuse!r}")
        self.capacity, self.max_reuse = int(capacity), int(max_reuse)
        self._items: deque[list] = deque()  # [batch, replays so far]
        self._rng = np.random.default_rng(seed)
        self.replayed = 0  # batches handed out by sample(), in total

    def __len__(self) -> int:
        return len(self._items)

    @property
    def steps(self) -> int:
        """Environment steps currently stored."""
        return sum(len(b["rewards"]) for b, _ in self._items)

    def add(self, batch: dict) -> None:
        if self.capacity == 0:
            return
        self._items.append([batch, 0])
        while len(self._items) > self.capacity:
            self._items.popleft()

    def sample(self, count: int) -> list[dict]:
        """Up to `count` distinct stored batches (oldest first); each use counts towards max_reuse."""
        if count <= 0 or not self._items:
            return []
        picked = np.sort(self._rng.choice(len(self._items), size=min(count, len(self._items)), replace=False))
        out = []
        for i in picked:
            item = self._items[i]
            item[1] += 1
            out.append(item[0])
        self._items = deque(item for item in self._items if item[1] < self.max_reuse)
        self.replayed += len(out)
        return out

    def clear(self) -> None:
        self._items.clear()
