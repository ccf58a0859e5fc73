"""A Launch's invocation records in Redis (the record and its rules: nitro.launches).

`claim` marks the invocations a Launch call will run (HSETNX: of two calls with the same ids, one runs each);
`finished` queues an invocation's outcome on the pipeline that bills it, so the record and the ledger agree;
`wait` answers the invocations another call claimed: their outcome once recorded, lost once their owner's
lease lapsed with them still running.
"""

from __future__ import annotations

import time

from nitro import launches
from nitro.contracts import LAUNCH_RECORD_TTL_S, launch_owner_key, launches_key
from nitro.launches import InvocationRecord

POLL_S = 0.2  # how often a retried Launch looks at the invocations another call runs


class LaunchConflict(Exception):
    """Invocation ids launched already with other parameters."""

    def __init__(self, ids: list[str]):
        super().__init__(f"{len(ids)} invocation(s) were launched already with other parameters "
                         f"(e.g. {ids[0]}): a retried Launch must repeat the same request")
        self.ids = ids


class LaunchRecords:
    def __init__(self, redis_client, *, poll_s: float = POLL_S):
        self.redis, self.poll_s = redis_client, poll_s

    def claim(self, job_id: str, round_index: int, ids: list[str], fingerprint: str,
              owner: str) -> tuple[list[str], dict[str, InvocationRecord]]:
        """(the ids this call runs, {id: record} of those an earlier or concurrent call runs or ran).
        Raises LaunchConflict, claiming nothing, if any of them was launched with another fingerprint."""
        key = launches_key(job_id, round_index)
        recorded = launches.decode_all(dict(zip(ids, self.redis.hmget(key, ids))))
        self._check(recorded, fingerprint)
        new = [i for i in ids if i not in recorded]
        if not new:
            return [], recorded
        pipe = self.redis.pipeline(transaction=False)
        mark = launches.running(fingerprint, owner).encode()
        for i in new:
            pipe.hsetnx(key, i, mark)
        pipe.expire(key, LAUNCH_RECORD_TTL_S)
        won = pipe.execute()[:-1]
        mine = [i for i, ok in zip(new, won) if ok]
        raced = [i for i, ok in zip(new, won) if not ok]  # a concurrent call with the same ids claimed them
        if raced:
            recorded.update(launches.decode_all(dict(zip(raced, self.redis.hmget(key, raced)))))
            try:
                self._check(recorded, fingerprint)
            except LaunchConflict:
                if mine:
                    self.redis.hdel(key, *mine)
                raise
        return mine, recorded

    @staticmethod
    def _check(recorded: dict[str, InvocationRecord], fingerprint: str) -> None:
        other = sorted(i for i, r in recorded.items() if r.fingerprint != fingerprint)
        if other:
            raise LaunchConflict(other)

    @staticmethod
    def finished(pipe, job_id: str, round_index: int, invocation_id: str, record: InvocationRecord) -> None:
        """Queue the invocation's outcome on `pipe` (the pipeline that bills it)."""
        key = launches_key(job_id, round_index)
        pipe.hset(key, invocation_id, record.encode())
        pipe.expire(key, LAUNCH_RECORD_TTL_S)

    def wait(self, job_id: str, round_index: int, recorded: dict[str, InvocationRecord],
             until: float) -> dict[str, InvocationRecord]:
        """The records of `recorded` once done: waits (until the monotonic time `until`) while their owners
        run them; a running one whose owner's lease lapsed is recorded lost. Those still running at `until`
        come back running."""
        key = launches_key(job_id, round_index)
        records = dict(recorded)
        while pending := [i for i, r in records.items() if not r.done]:
            records.update(launches.decode_all(dict(zip(pending, self.redis.hmget(key, pending)))))
            pending = [i for i in pending if not records[i].done]
            owners = sorted({records[i].owner for i in pending})
            if owners:
                pipe = self.redis.pipeline(transaction=False)
                for o in owners:
                    pipe.exists(launch_owner_key(job_id, o))
                alive = {o for o, n in zip(owners, pipe.execute()) if n}
                orphans = [i for i in pending if records[i].owner not in alive]
                # Read again: an owner writes every outcome before it drops its lease.
                again = self.redis.hmget(key, orphans) if orphans else []
                for i, r in launches.decode_all(dict(zip(orphans, again))).items():
                    records[i] = r if r.done else launches.lost(r, i)
                    if not r.done:
                        self.finished(self.redis, job_id, round_index, i, records[i])
            if all(r.done for r in records.values()) or time.monotonic() >= until:
                break
            time.sleep(self.poll_s)
        return records
