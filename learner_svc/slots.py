"""Which actor slots of a round have delivered their batch: the one rule every loop counts by.

An actor's batch may reach the stream split in parts (nitro.data.batching: each part a complete batch of
its own, signed with its part number and count). A slot counts as delivered, for closing the round and for
`actors_completed`, only when every part of one of its invocations is in; each part is still data the loop
may use as it arrives (IMPACT learns from it at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nitro.contracts import actor_slot, invocation_id


@dataclass
class ActorSlots:
    """Round k's actor slots: the parts of each invocation seen so far, and the slots whose batch is whole
    (which invocations failed is each launch's to say: state.Wave).

    `ids`: the invocation ids that count (invocation id -> slot), registered per wave with `expect`; None
    counts any actor invocation of this job and round, whatever its wave."""

    job_id: str
    k: int
    actors: int
    ids: dict[str, int] | None = None
    covered: set[int] = field(default_factory=set)  # slots with a whole batch in
    _parts_seen: dict[str, set[int]] = field(default_factory=dict)
    _parts_total: dict[str, int] = field(default_factory=dict)

    def expect(self, slots: list[int], wave: int) -> None:
        """Count the invocations of `slots` in wave `wave` (ids registered: `ids` is not None from here on)."""
        if self.ids is None:
            self.ids = {}
        for s in slots:
            self.ids[invocation_id(self.job_id, self.k, s, wave)] = s

    def slot(self, inv_id: str) -> int | None:
        """The slot of an invocation that counts toward this round, else None."""
        if self.ids is not None:
            return self.ids.get(inv_id)
        return actor_slot(inv_id, self.job_id, self.k)

    def arrived(self, inv_id: str, part: int = 0, parts: int = 1) -> int | None:
        """Record part `part` of `parts` of invocation `inv_id`'s batch; its slot (whole or not), or None when
        the invocation does not count toward this round."""
        slot = self.slot(inv_id)
        if slot is None:
            return None
        seen = self._parts_seen.setdefault(inv_id, set())
        seen.add(part)
        self._parts_total[inv_id] = parts
        if len(seen) >= parts:
            self.covered.add(slot)
        return slot

    @property
    def completed(self) -> int:
        """Invocations whose every part arrived."""
        return sum(1 for inv, seen in self._parts_seen.items() if len(seen) >= self._parts_total[inv])

    def waiting(self, slots: list[int] | None = None) -> set[int]:
        """Of `slots` (all the round's by default), those without a whole batch yet."""
        return set(range(self.actors) if slots is None else slots) - self.covered
