"""Forged, tampered, malformed and oversized trajectory stream entries during a real job.

A running system and a CartPole job; after its first round, entries are pushed
into the job's stream (nitro:{job}:traj) with the service user's client, as
anyone holding a Redis password could; those "signed with the real key" are
signed with the key of the invocation they name, which is what a compromised
actor of the job holds (its own invocation's key). Among them a pickle whose reduce would run `touch <marker>`. The marker
must never appear, the job must finish SUCCEEDED with exactly the actors'
steps trained on, and every entry must be rejected and counted by reason.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import time
import zlib
from collections import Counter

import numpy as np
import pytest

from nitro.client.sdk import NitroClient
from nitro.contracts import invocation_key, stream_key
from nitro.data import codec
from nitro.data.redis_client import connect
from nitro.rpc.metrics import scrape
from tests.envelopes import body as _body
from tests.envelopes import sign as _sign
from tests.envelopes import sign_ntr2
from tests.system import start_system

pytestmark = [pytest.mark.timeout(420), pytest.mark.system]

JOB = "hostile-stream"
ROUNDS, ACTORS, STEPS = 8, 2, 64  # the hostile entries land after round 0; 7 short rounds read them
LEARNER_MAX_PAYLOAD = 256 << 20  # TrajectoryReader's default max_payload_bytes


class _RunsCommand:
    """Pickles to `os.system(command)`: what an unrestricted pickle.loads would execute."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _zlib_bomb(size: int) -> bytes:
    """zlib of `size` zero bytes, built a megabyte at a time (the bomb itself is ~0.3 MB)."""
    c, chunk = zlib.compressobj(9), bytes(1 << 20)
    parts = [c.compress(chunk) for _ in range(size >> 20)]
    return b"".join(parts) + c.flush()


def hostile_entries(master: bytes, marker: str) -> list[tuple[str, str, dict]]:
    """(name, expected rejection reason, stream fields)."""

    def key(inv: str) -> bytes:  # the key the invocation `inv` of the job holds
        return invocation_key(master, JOB, inv)

    forged = pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=5)
    # posix.system(<first out-of-band buffer>): the command rides as buffer bytes beside a real array.
    oob_forged = _body(b"\x80\x05cposix\nsystem\n\x97\x85R.", [f"touch {marker}".encode(), bytes(64)])
    ntr1 = b"NTR1\x00" + hmac.new(key("evil-ntr1"), b"NTR1\x00" + forged, hashlib.sha256).digest() + forged
    meta = {b"inv": b"evil-0", b"round": b"1", b"version": b"1", b"steps": str(STEPS).encode()}

    def fields(inv: str, payload: bytes | None, extra: dict | None = None) -> dict:
        f = {**meta, b"inv": inv.encode(), **(extra or {})}
        if payload is not None:
            f[b"payload"] = payload
        return f

    batch = {"rewards": np.ones(STEPS, np.float32), "obs": np.zeros((STEPS, 4), np.float32)}
    signed = codec.encode(("evil-tampered", 1, 1, STEPS, batch), key("evil-tampered"))
    tampered = bytearray(signed)
    tampered[-5] ^= 0x01
    relabelled = codec.encode(("evil-relabelled", 1, 1, STEPS, batch), key("evil-relabelled"))
    return [
        ("forged pickle, no envelope", "unsigned", fields("evil-raw", forged)),
        ("forged pickle, made-up MAC", "bad_signature",
         fields("evil-mac", codec.MAGIC + b"\x00" + bytes(12) + forged + bytes(16))),
        ("forged pickle signed with the real key", "disallowed_type", fields("evil-signed", _sign(_body(forged), key("evil-signed")))),
        # The decoder's opcode walk (dd8ffb6) refuses this pickle before the unpickler runs, so os.system is never
        # looked up: malformed, no longer disallowed_type.
        ("signed pickle handing an out-of-band buffer to os.system", "malformed",
         fields("evil-oob", _sign(oob_forged, key("evil-oob")))),
        ("signed, buffer table longer than the body", "malformed",
         fields("evil-table", _sign(_body(pickle.dumps([1], protocol=5), [b"x" * 8], lengths=[1 << 20]),
                                    key("evil-table")))),
        ("signed, unknown envelope flags", "malformed",
         fields("evil-flags", _sign(_body(forged), key("evil-flags"), flags=0x40))),
        ("previous envelope version NTR1, signed with the real key", "malformed", fields("evil-ntr1", ntr1)),
        ("previous envelope version NTR2 (HMAC-SHA256), signed with the real key", "malformed",
         fields("evil-ntr2", sign_ntr2(_body(forged), key("evil-ntr2")))),
        ("tampered signed payload", "bad_signature", fields("evil-tampered", bytes(tampered))),
        ("signed payload, stream fields relabelled", "bad_signature",
         fields("evil-relabelled", relabelled, {b"steps": b"100000"})),
        ("missing payload field", "unsigned", {b"inv": b"evil-missing"}),
        ("no fields but a payload: no invocation to verify it as", "unsigned", {b"payload": signed}),
        ("signed, not a trajectory record", "malformed",
         fields("evil-shape", codec.encode({"a": 1}, key("evil-shape")))),
        ("signed by this job's invocation a0 as its a1", "bad_signature",
         fields(f"{JOB}-r1-a1", codec.encode((f"{JOB}-r1-a1", 1, 1, STEPS, batch), key(f"{JOB}-r1-a0")))),
        ("signed with the master key itself", "bad_signature",
         fields(f"{JOB}-r1-a1", codec.encode((f"{JOB}-r1-a1", 1, 1, STEPS, batch), master))),
        ("signed, not an actor invocation of this job", "foreign_invocation",
         fields("evil-named", codec.encode(("evil-named", 1, 1, STEPS, batch), key("evil-named")))),
        ("oversized: 5 MB of junk", "unsigned", fields("evil-junk", os.urandom(64) * (5 * (1 << 20) // 64))),
        ("oversized: signed zlib bomb over the learner's limit", "too_large",
         fields("evil-bomb", _sign(_zlib_bomb(LEARNER_MAX_PAYLOAD + (1 << 20)), key("evil-bomb"), flags=0x01))),
    ]


def rejected_by_reason(port: int) -> Counter:
    fam = scrape(port).get("nitro_rejected_payloads", [])
    return Counter({s.labels["reason"]: s.value for s in fam if s.name == "nitro_rejected_payloads_total"})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-stream")
    marker, control = tmp / "pwned", tmp / "control"
    system = start_system(tmp / "state", concurrency=4)
    try:
        key = bytes.fromhex(system.hmac_key)
        entries = hostile_entries(key, str(marker))
        redis = connect(system.redis_url)
        metrics_port = system.components["learner"].metrics_port
        before = rejected_by_reason(metrics_port)
        spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": ROUNDS, "steps_per_actor": STEPS,
                "eval_episodes": 1, "budget_usd": 1.0, "seed": 5, "job_id": JOB,
                "scaler": {"policy": "fixed", "fixed_actors": ACTORS, "i_min": 1, "i_max": ACTORS}}
        with NitroClient(system.learner_address) as client:
            client.start_training(spec)
            reports = []
            for report in client.watch(JOB):
                reports.append(report)
                if report.round == 0:  # the job is mid-flight: later rounds read the stream
                    for _, _, fields in entries:
                        redis.xadd(stream_key(JOB), fields)
            status = client.get(JOB)
        time.sleep(1.0)  # let anything a payload might have started finish
        # Positive control: the same kind of payload does run a command when unpickled without restriction.
        pickle.loads(pickle.dumps(_RunsCommand(f"touch {control}"), protocol=5))
        yield {"system": system, "entries": entries, "reports": reports, "status": status, "marker": marker,
               "control": control, "before": before, "after": rejected_by_reason(metrics_port),
               "stream_len": redis.xlen(stream_key(JOB)),
               "learner_log": open(system.components["learner"].log, errors="replace").read()}
    finally:
        system.stop()


def test_forged_pickle_never_runs(run):
    assert run["control"].exists(), "the forged payload is live: unrestricted unpickling runs it"
    assert not run["marker"].exists(), "a command from a stream entry ran on the learner"


def test_job_completes_with_only_the_actors_samples(run):
    status, reports = run["status"], run["reports"]
    assert status.state_name == "SUCCEEDED", status.message
    assert [r.round for r in reports] == list(range(ROUNDS))
    for r in reports:
        assert r.actors_completed == r.actors_launched == ACTORS
        assert r.env_steps == ACTORS * STEPS, "a hostile entry was trained on"
    assert status.total_env_steps == ROUNDS * ACTORS * STEPS


def test_every_entry_rejected_and_dropped(run):
    log = run["learner_log"]
    reasons = Counter(line.rsplit(": ", 1)[-1].strip() for line in log.splitlines()
                      if "rejected trajectory entry" in line and JOB in line)
    expected = Counter(reason for _, reason, _ in run["entries"])
    assert reasons == expected
    assert run["stream_len"] == 0, "rejected entries are acked and deleted"


def test_rejections_counted_in_the_learner_metric_and_reports(run):
    delta = run["after"] - run["before"]
    expected = Counter(reason for _, reason, _ in run["entries"])
    assert all(delta[reason] >= n for reason, n in expected.items()), (dict(delta), dict(expected))
    assert sum(r.rejected_batches for r in run["reports"]) == len(run["entries"])
    notes = [n for r in run["reports"] for n in r.notes if n.startswith("rejected ")]  # and say why, in the notes
    assert sum(int(n.split()[1]) for n in notes) == len(run["entries"]) and "foreign_invocation 1" in " ".join(notes)
