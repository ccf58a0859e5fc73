"""The collector: how every loop launches a round's actors and reads their batches, written once.

`Collector.launch` starts a wave of a Round (a fresh wave number, the blocking Launch in a learner thread);
`Collector.pump` reads the job's stream until the loop says it is done, takes each wave's response as it
returns, classifies every entry through `Round.ingest` and hands it to the loop, which supplies only what it
does with a batch: PPO keeps it for the update, IMPACT learns from it or replays, Stellaris dispatches a
learner function. The pump measures the round's phases on the learner's critical path the same way for all:
`ingest` is the reader's verify/decode/dedup time plus what the loop counts as ingest (acks, dispatch),
`update` what the loop counts as learning, and `sample` the rest of the wall time, spent waiting for actors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from learner_svc.state import Ingest, Round, Wave
from nitro.clock import critical_path_cpu_seconds
from nitro.v1 import scaler_pb2


@dataclass
class Pumped:
    """What one pump measured: wall time, the phases the loop and the reader counted, and the learner's CPU."""

    wall: float = 0.0
    counted: dict[str, float] = field(default_factory=dict)  # "ingest", "update", ...: the loop's own work
    reader_ingest: float = 0.0  # the reader's verify/decode/dedup time
    cpu: float = 0.0  # the learner's critical-path CPU seconds meanwhile (the cloud clock's learner time)

    def add(self, phase: str, seconds: float) -> None:
        self.counted[phase] = self.counted.get(phase, 0.0) + seconds

    def timed(self, phase: str, fn: Callable, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.add(phase, time.perf_counter() - t)

    @property
    def ingest(self) -> float:
        return self.reader_ingest + self.counted.get("ingest", 0.0)

    def sample(self, *others: float) -> float:
        """The wall time not spent ingesting, learning or on `others`: waiting for the actors."""
        busy = self.ingest + sum(v for k, v in self.counted.items() if k != "ingest") + sum(others)
        return max(0.0, self.wall - busy)


class Collector:
    """Launches and reads for one loop (`loop`: a RoundLoop, for its services, stream reader and stop flag)."""

    def __init__(self, loop):
        self.loop = loop

    def launch(self, rnd: Round, slots: Iterable[int], deadline_s: float) -> Wave:
        """A new wave of `slots` of round `rnd` (invocation ids are never reused within a round, across
        restarts too: `new_wave`)."""
        loop, slots = self.loop, list(slots)
        number = loop.new_wave(rnd.k)
        return rnd.launch(number, slots, loop.pool.submit(loop.launch, rnd.k, slots, number), deadline_s)

    def pump(self, rnd: Round | None, done: Callable[[], bool],
             on_entries: Callable[[list[tuple[object, Ingest]], Pumped], None], *, read: tuple[int, int],
             notes: list[str], on_response: Callable[[scaler_pb2.LaunchResponse], None] | None = None,
             on_idle: Callable[[Pumped], None] | None = None) -> Pumped:
        """Read and classify until `done()` (checked after each wave response is taken) or the job is stopped.

        `on_entries` gets each read's entries with what `rnd` made of them (LATE without a round);
        `on_idle` is called after a read that brought nothing; both may count their time in the Pumped."""
        loop = self.loop
        out = Pumped()
        t0, cpu0, processed0 = time.perf_counter(), critical_path_cpu_seconds(), loop.reader.processing_seconds
        try:
            while not loop.job.stop_requested.is_set():
                if rnd is not None and rnd.waves and (resp := rnd.poll(notes)) is not None and on_response:
                    on_response(resp)
                if done():
                    break
                entries = loop.redis_call(lambda: loop.reader.read(*read), "stream read")
                if entries:
                    on_entries([(e, rnd.ingest(e) if rnd is not None else Ingest.LATE) for e in entries], out)
                elif on_idle is not None:
                    on_idle(out)
            if rnd is not None and rnd.waves and (resp := rnd.poll(notes)) is not None and on_response:
                on_response(resp)
        finally:
            out.wall = time.perf_counter() - t0
            out.reader_ingest = loop.reader.processing_seconds - processed0
            out.cpu = max(0.0, critical_path_cpu_seconds() - cpu0)
        return out
