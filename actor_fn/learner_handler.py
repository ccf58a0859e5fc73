"""The serverless learner function of learner_mode "stellaris" (a second Lambda handler in the actor image).

Event (JSON, built by the scaler's Launch with kind "learner"): nitro.events.LearnerEvent, read with
LearnerEvent.from_dict (a ConfigError naming the field for a missing, unknown or bad one): job_id, round
(during which the parameter service received the batch), policy_version (the base version v_g: the update is
computed at pi_{v_g}), invocation_id (retries reuse it: the service drops duplicates), payload_ref (the Redis
key nitro:{job_id}:learn:parcel:... of the signed parcel), credentials (as for actors, actor_fn/handler.py)
and optionally redis_url (else NITRO_REDIS_URL).

The batch travels as a parcel the parameter service parked in Redis, not as
stream entry ids: the service has already verified, deduplicated and acked the
actor's entry, and the parcel carries everything the update depends on (the
batch, its behaviour version, the base version, algorithm settings, the KL
coefficient, rho-bar) under one HMAC, so nothing in the unsigned event can
change what is computed beyond which parcel is read.

Work: read `policy:latest`, then the service's signed staleness record
(nitro:{job}:learn:staleness, written before each version it publishes); when
the record puts v_g's staleness (versions since v_g that applied another base's
update, nitro.algos.stellaris.base_staleness) above the parcel's `max_staleness`
(the bound of the round that dispatched it), the update is certain to be
dropped (certainly_dropped): compute nothing, XADD a signed skip record instead
and return {"skipped": ...}. Without a record that verifies it computes (it
skips only when certain). Otherwise load pi_{v_g}, and the `recent_versions`
newest published versions after it (`policy:latest` down), run
nitro.algos.stellaris.compute_update (PPO or IMPACT loss with global
importance-sampling truncation), and XADD the signed flat update with its base
version to nitro:{job}:learn:updates. The parcel, the policies and the
staleness record are verified with the job's read key; the update (or skip
record) is signed with the invocation's own key, which the parameter service
derives again from the entry's invocation id. Returns a JSON summary.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

from actor_fn.runtime import redis_url, warm_client
from nitro.clock import InvocationClock
from nitro.contracts import latest_policy_key, staleness_record_key, update_stream_key
from nitro.data import codec
from nitro.events import LearnerEvent

UPDATE_STREAM_MAXLEN = 10_000  # a memory cap for a stalled parameter service; it deletes what it reads
POLICY_CACHE = 4  # policy versions a warm function keeps (its base and the newest ones)
RECENT_LOOKUPS = 64


class ParcelNotFoundError(LookupError):
    """The parcel named in the event is gone (expired, or the job ended)."""


class BadParcelError(ValueError):
    """The parcel does not verify or does not match the event."""


class _Warm:
    policies: OrderedDict = OrderedDict()  # (job, version, read key) -> Policy
    invocations = 0


def _policy(client, job_id: str, version: int, key: bytes):
    """The policy of `version` (cached while warm); PolicyNotFoundError when it is not published."""
    from nitro.data.store import PolicyStore
    from nitro.policy.models import policy_from_blob

    ck = (job_id, version, key)
    if ck in _Warm.policies:
        _Warm.policies.move_to_end(ck)
        return _Warm.policies[ck]
    policy, got = policy_from_blob(PolicyStore(client, job_id).get(version), key)
    if got != version:
        raise BadParcelError(f"policy blob of version {version} says version {got}")
    policy.requires_grad_(False)
    _Warm.policies[ck] = policy
    while len(_Warm.policies) > POLICY_CACHE:
        _Warm.policies.popitem(last=False)
    return policy


def _recent(client, job_id: str, base: int, count: int, key: bytes, latest: int | None) -> list:
    """Up to `count` newest published versions after `base`, newest first, from `latest` down.

    The service publishes one version per aggregation but prunes old ones, so a number may be
    missing; the walk down from `policy:latest` skips missing ones, within a bounded number of
    lookups.
    """
    from nitro.data.store import PolicyNotFoundError

    out = []
    v = latest if latest is not None else base
    lookups = 0
    while v > base and len(out) < count and lookups < RECENT_LOOKUPS:
        lookups += 1
        try:
            out.append(_policy(client, job_id, v, key))
        except PolicyNotFoundError:  # pruned or expired between reading latest and loading
            pass
        v -= 1
    return out


def handler(event: dict, context=None) -> dict:
    clock = InvocationClock()  # the cloud clock (docs/cost.md): CPU time, Redis calls at wall time
    t0 = time.perf_counter()
    ev = LearnerEvent.from_dict(event)  # ConfigError naming the field
    import numpy as np
    import torch

    from nitro.algos.stellaris import (
        UpdateRecord,
        base_staleness,
        certainly_dropped,
        check_parcel,
        compute_update,
        skip_record,
    )
    from nitro.config import make_config
    from nitro.stellaris_records import decode_staleness_record, encode_update

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a function gets about one vCPU per 1.8 GB; more threads only contend
    creds = ev.credentials
    cold = _Warm.invocations == 0
    _Warm.invocations += 1
    key, signing_key = creds.read_key_bytes, creds.signing_key_bytes
    job_id, base = ev.job_id, ev.policy_version
    client = warm_client(redis_url(event, creds), clock)

    with clock.io():
        blob = client.get(ev.payload_ref)
    if blob is None:
        raise ParcelNotFoundError(f"no parcel at {ev.payload_ref} (expired, or the job ended)")
    try:
        parcel = check_parcel(codec.decode(blob, key))
    except (codec.PayloadError, ValueError) as exc:
        raise BadParcelError(f"parcel at {ev.payload_ref} is unusable: {exc}") from None
    if parcel["job_id"] != job_id or parcel["base_version"] != base:
        raise BadParcelError(f"parcel is for job {parcel['job_id']!r} version {parcel['base_version']}, the event "
                             f"names job {job_id!r} version {base}")
    with clock.io():  # one round trip, latest first: the record read after it is at least as new (written first)
        pipe = client.pipeline(transaction=False)
        pipe.get(latest_policy_key(job_id))
        pipe.get(staleness_record_key(job_id))
        latest_raw, record_blob = pipe.execute()
    latest = int(latest_raw) if latest_raw is not None else None
    bound = parcel.get("max_staleness")
    staleness = base_staleness(decode_staleness_record(record_blob, key), base)
    if latest is not None and certainly_dropped(staleness, bound):
        rec = skip_record(ev.invocation_id, ev.round, base, latest, bound, staleness)
        fields = {b"inv": ev.invocation_id.encode(), b"base": str(base).encode(),
                  b"payload": encode_update(rec, signing_key)}
        with clock.io():
            entry = client.xadd(update_stream_key(job_id), fields, maxlen=UPDATE_STREAM_MAXLEN, approximate=True)
        return {"ok": True, "skipped": "stale_base", "job_id": job_id, "invocation_id": ev.invocation_id,
                "round": ev.round, "policy_version": base, "latest_version": latest, "max_staleness": bound,
                "staleness": staleness,
                "entry_id": entry.decode() if isinstance(entry, bytes) else str(entry), "cold": cold,
                "duration_ms": round((time.perf_counter() - t0) * 1e3, 3), "clock": clock.report(cold)}
    cfg = make_config(parcel["algo"], "tuned", **parcel["config"])
    with clock.io():  # Redis reads (and the blobs' decoding, a small share)
        policy = _policy(client, job_id, base, key)
        recent = _recent(client, job_id, base, parcel["recent_versions"], key, latest)
    t_loaded = time.perf_counter()

    update, stats = compute_update(policy, parcel["batches"], cfg, parcel["algo"], kl_coeff=parcel["kl_coeff"],
                                   rho_bar=parcel["rho_bar"], recent=recent, seed=parcel["seed"])
    t_computed = time.perf_counter()
    steps = sum(len(b["rewards"]) for b in parcel["batches"])
    stats["recent_versions_used"] = len(recent)
    rec = UpdateRecord(ev.invocation_id, ev.round, base, steps, update, stats)
    fields = {b"inv": ev.invocation_id.encode(), b"base": str(base).encode(),
              b"payload": encode_update(rec, signing_key)}
    with clock.io():
        entry = client.xadd(update_stream_key(job_id), fields, maxlen=UPDATE_STREAM_MAXLEN, approximate=True)
    t_pushed = time.perf_counter()
    return {
        "ok": True,
        "job_id": job_id,
        "invocation_id": ev.invocation_id,
        "round": ev.round,
        "policy_version": base,
        "entry_id": entry.decode() if isinstance(entry, bytes) else str(entry),
        "steps": steps,
        "recent_versions_used": len(recent),
        "rho_mean": round(float(stats["rho_mean"]), 6),
        "update_norm": round(float(np.linalg.norm(update)), 6),
        "cold": cold,
        "load_ms": round((t_loaded - t0) * 1e3, 3),
        "compute_ms": round((t_computed - t_loaded) * 1e3, 3),
        "push_ms": round((t_pushed - t_computed) * 1e3, 3),
        "duration_ms": round((t_pushed - t0) * 1e3, 3),
        "clock": clock.report(cold),
    }
