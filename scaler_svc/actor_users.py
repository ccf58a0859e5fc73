"""Each job's own Redis user for its functions (nitro.data.redis_acl), owned by the scaler.

Life of a job's user `nitro-actor-{job}`:
  created  at the job's first Launch (`ensure`): a random password, stored in the job's scaler hash (so every
           scaler replica hands out the same one), and ACL SETUSER with the job's rules. Every Launch ensures it
           again (idempotent), and while a Launch runs its job's user is set again every LAUNCH_LEASE_REFRESH_S
           (`hold`): ACL users live in Redis's memory only, so a restarted Redis has lost them.
  handed   to that job's invocations only, inside their events (nitro.contracts.FunctionCredentials).
  deleted  when the job ends: the learner calls EndJob (`end`: the password first, then the user; Redis closes
           the user's connections).
  swept    when a scaler starts (`sweep`): a user whose job has no stored password any more (EndJob got halfway,
           or the job's scaler state expired) is deleted. A job whose EndJob never reached a scaler is ended again
           by its learner's next start (learner_svc/server.py: load_saved_jobs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from nitro.contracts import LAUNCH_LEASE_REFRESH_S, SCALER_STATE_TTL_S, scaler_state_key
from nitro.data import redis_acl

log = logging.getLogger(__name__)

PASSWORD_FIELD = "actor_password"  # in the job's scaler hash (nitro:{job}:scaler), which actors cannot read


class ActorUsers:
    def __init__(self, redis_client, *, refresh_s: float = LAUNCH_LEASE_REFRESH_S):
        self.redis, self.refresh_s = redis_client, refresh_s
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._refresher: threading.Thread | None = None

    def ensure(self, job_id: str) -> str:
        """The password of job `job_id`'s user, created (user and password) when it has none; the user is set to
        exactly its rules. Two replicas racing agree: the first password stored wins (HSETNX)."""
        key = scaler_state_key(job_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(key, PASSWORD_FIELD, redis_acl.new_password())
        pipe.hget(key, PASSWORD_FIELD)
        pipe.expire(key, SCALER_STATE_TTL_S)
        password = pipe.execute()[1].decode()
        redis_acl.set_actor_user(self.redis, job_id, password)
        return password

    @contextmanager
    def hold(self, job_id: str) -> Iterator[None]:
        """Set the job's user again every refresh_s while the block runs (a Redis restart forgets ACL users), as
        long as the job has not ended (its password is still stored)."""
        with self._lock:
            self._held[job_id] += 1
            if self._refresher is None:
                self._refresher = threading.Thread(target=self._refresh, name="actor-users", daemon=True)
                self._refresher.start()
        try:
            yield
        finally:
            with self._lock:
                self._held[job_id] -= 1
                if not self._held[job_id]:
                    del self._held[job_id]

    def _refresh(self) -> None:
        while True:
            time.sleep(self.refresh_s)
            with self._lock:  # and `end` takes it too: this process never sets a user again that it just deleted
                if not self._held:
                    self._refresher = None
                    return
                for job_id in list(self._held):
                    try:
                        password = self.redis.hget(scaler_state_key(job_id), PASSWORD_FIELD)
                        if password is not None:  # None: the job ended meanwhile; its user stays deleted
                            redis_acl.set_actor_user(self.redis, job_id, password.decode())
                    except redis.RedisError as exc:
                        log.warning("could not set the Redis user of job %s again: %s", job_id, exc)

    def end(self, job_id: str) -> bool:
        """Forget the job's password, then delete its user; whether a user was deleted."""
        with self._lock:
            self.redis.hdel(scaler_state_key(job_id), PASSWORD_FIELD)
            return redis_acl.delete_actor_user(self.redis, job_id)

    def sweep(self) -> list[str]:
        """Delete the users of jobs that have no stored password (ended, or their state expired); their jobs."""
        jobs = redis_acl.actor_user_jobs(self.redis)
        if not jobs:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hexists(scaler_state_key(job_id), PASSWORD_FIELD)
        ended = [job_id for job_id, live in zip(jobs, pipe.execute()) if not live]
        for job_id in ended:
            redis_acl.delete_actor_user(self.redis, job_id)
        if ended:
            log.info("deleted the Redis users of %d ended job(s): %s", len(ended), ", ".join(ended))
        return ended
