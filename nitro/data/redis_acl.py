"""The Redis ACL users nitro needs, in one place: their rules, and how a job's functions get a user of their own.

Redis 6.2 syntax (no selectors), so the same rules run on nitro's own redis-server and on Redis 7:

    default         off: a connection without credentials can do nothing
    nitro-service   the learner and detector: every command on nitro:* keys but the server-wide dangerous ones
    nitro-scaler    the scaler: the same, plus ACL SETUSER, DELUSER and USERS, to manage the job users below
    nitro-actor-J   job J's actor and Stellaris learner functions: XADD and GET on J's own stream, policies and
                    learn: keys (nitro.contracts.actor_key_patterns), nothing else; created by the scaler with a
                    random password when J launches, deleted when J ends (docs/security.md)

nitro.local.redis_server writes the first three into its redis.conf; deploy/k8s/base/config/redis-start.sh writes the
same lines (tests/test_deploy_redis.py compares them).
"""

from __future__ import annotations

import hashlib
import secrets

import redis

from nitro.contracts import ALL_KEYS_PATTERN, actor_key_patterns, actor_user, job_of_actor_user

SERVICE_USER = "nitro-service"
SCALER_USER = "nitro-scaler"
# Every command on nitro's keys, none of the server-wide dangerous ones (FLUSHALL, KEYS, CONFIG SET, DEBUG,
# SHUTDOWN, MODULE, ACL, ...); CONFIG GET for the persistence check.
SERVICE_RULES = f"resetkeys ~{ALL_KEYS_PATTERN} resetchannels -@all +@all -@dangerous +config|get"
# The scaler also manages the job users: exactly the three ACL subcommands that takes (not ACL LIST, GETUSER,
# LOAD, SAVE or LOG). Redis cannot restrict what SETUSER may grant, so this user can create a user with any
# rights: its password is as sensitive as an administrator's.
SCALER_RULES = SERVICE_RULES + " +acl|setuser +acl|deluser +acl|users"
# A job's functions: append to the job's streams and read what the learner published for it. PING for redis-py's
# health checks; AUTH/HELLO to log in; MULTI/EXEC/DISCARD because the parts of a split batch go in one transaction
# (each queued command is still checked). XADD's MAXLEN trim is part of XADD.
ACTOR_COMMANDS = "-@all +xadd +get +ping +auth +hello +multi +exec +discard"


def actor_rules(job_id: str) -> str:
    """The ACL rules of job `job_id`'s functions' user (after `on` and its password)."""
    return "resetkeys " + " ".join(f"~{p}" for p in actor_key_patterns(job_id)) + " resetchannels " + ACTOR_COMMANDS


def new_password() -> str:
    """A fresh random password for a job's user: 32 characters of [A-Za-z0-9_-]."""
    return secrets.token_urlsafe(24)


def set_actor_user(client: redis.Redis, job_id: str, password: str) -> None:
    """Create job `job_id`'s user, or reset it to exactly its rules and `password` (idempotent: the same call again
    changes nothing, and connections logged in as the user stay). Redis keeps only the password's SHA-256."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    client.execute_command("ACL", "SETUSER", actor_user(job_id), "reset", "on", f"#{digest}",
                           *actor_rules(job_id).split())


def delete_actor_user(client: redis.Redis, job_id: str) -> bool:
    """Delete job `job_id`'s user (Redis closes its connections); whether there was one."""
    return bool(client.execute_command("ACL", "DELUSER", actor_user(job_id)))


def actor_user_jobs(client: redis.Redis) -> list[str]:
    """The jobs that have a functions' user in this Redis."""
    names = client.execute_command("ACL", "USERS")
    jobs = (job_of_actor_user(n.decode() if isinstance(n, bytes) else n) for n in names)
    return sorted(j for j in jobs if j is not None)
