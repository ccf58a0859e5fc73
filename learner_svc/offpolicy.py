"""The off-policy (IMPACT) loop of DESIGN section 4: sampling overlaps learning.

Round k's actors are launched as soon as round k-1's data is in and its plan
is made; while they sample, the learner updates on every batch the moment it
arrives (V-trace and the clipped target network correct for the policy lag)
and, when the stream is momentarily empty, replays recent batches from a
bounded buffer instead of idling. A round closes when its invocations ended
and their batches arrived (or its deadline passed); then the latest policy is
published and scored, the next round is planned and launched, and only then is
the closed round evaluated and reported, so evaluation overlaps the next
round's sampling too.

Every batch's policy lag (learner version minus the version that sampled it)
goes into the nitro_policy_lag histogram; its mean and max are in the round's
notes.

Durability: the batches a round learned from stay unacknowledged until the
round is committed (RoundLoop.commit, after it closed). A learner killed before
that learns from them again after a resume (what it had learned died with it);
the replay buffer is not checkpointed, replayed updates are not counted as
steps.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from learner_svc.rounds import DIAGNOSTICS, RoundLoop
from nitro.algos.impact import IMPACTLearner
from nitro.algos.replay import ReplayBuffer
from nitro.clock import critical_path_cpu_seconds
from nitro.contracts import MAX_EMPTY_ROUNDS, actor_slot
from nitro.cost import cloud_round_seconds
from nitro.rpc import metrics
from nitro.v1 import scaler_pb2, training_pb2

log = logging.getLogger(__name__)

MAX_REPLAYS_PER_FRESH = 1  # replay updates allowed per fresh batch: keeps replay from dominating


class OffPolicyLoop(RoundLoop):
    learner_class = IMPACTLearner

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.replay = ReplayBuffer(self.cfg.replay_capacity, self.cfg.replay_max_reuse, seed=self.spec.seed)

    def train(self, resume: bool = False):
        return self._loop(resume)

    # -- launching ----------------------------------------------------------------------
    def _launch_round(self, k: int, actors: int) -> dict:
        wave = self.new_wave(k)
        metrics.set_job(metrics.ACTORS_PER_ROUND, self.job.job_id, actors)
        return {"k": k, "actors": actors, "version": self.version, "start": time.perf_counter(),
                "future": self.pool.submit(self.launch, k, list(range(actors)), wave), "resp": None,
                "done_at": None, "covered": set(), "failed": set(), "steps": 0, "batches": 0}

    # -- learning while sampling -------------------------------------------------------------
    def _train_until_closed(self, rnd: dict, acc: dict, phases: dict, cloud: dict) -> None:
        """Update on every arriving batch of this job, replay when idle, until `rnd` closes.

        On the cloud clock the round's actors and the learner run in parallel: the learner's CPU
        time is "update", and "sample" is only what the slowest actor takes beyond it."""
        notes = acc["notes"]
        processed_before = self.reader.processing_seconds
        t0, cpu0 = time.perf_counter(), critical_path_cpu_seconds()
        update_s = 0.0
        while not self._round_closed(rnd) and not self.job.stop_requested.is_set():
            self._poll_launch(rnd, notes)
            entries = self.redis_call(lambda: self.reader.read(count=16, block_ms=20), "stream read")
            fresh = []
            for e in entries:
                lag = self.version - e.policy_version
                metrics.POLICY_LAG.observe(lag)
                acc["lags"].append(lag)
                fresh.append(e.batch)
                if e.round == rnd["k"]:
                    slot = actor_slot(e.invocation_id, self.job.job_id, rnd["k"])
                    if slot is not None:
                        rnd["covered"].add(slot)
                    rnd["steps"] += e.steps
                    rnd["batches"] += 1
                else:  # a straggler of an earlier round, or of a round launched before a resume: still good data
                    acc["late"] += 1
            if fresh:
                t_u = time.perf_counter()
                self._update(fresh, acc)
                update_s += time.perf_counter() - t_u
                for b in fresh:
                    self.replay.add(b)
                acc["replay_credit"] += MAX_REPLAYS_PER_FRESH * len(fresh)
                acc["entries"].extend(entries)  # acked when the round's commit holds what was learned
            elif acc["replay_credit"] > 0 and len(self.replay):
                replayed = self.replay.sample(1)
                if replayed:
                    t_u = time.perf_counter()
                    self._update(replayed, acc, replay=True)
                    update_s += time.perf_counter() - t_u
                    acc["replay_credit"] -= 1
        self._poll_launch(rnd, notes)
        wall = time.perf_counter() - t0
        ingest = self.reader.processing_seconds - processed_before
        metrics.observe_phase("update", update_s, phases)
        metrics.observe_phase("ingest", ingest, phases)
        metrics.observe_phase("sample", max(0.0, wall - update_s - ingest), phases)
        busy = max(0.0, critical_path_cpu_seconds() - cpu0)
        sampling = rnd["resp"].cloud_seconds if rnd["resp"] is not None else 0.0
        busy += cloud.pop("carried", 0.0)  # the previous round's checkpoint and evaluation ran meanwhile
        cloud["update"] = busy
        cloud["sample"] = max(0.0, sampling - busy)

    def _update(self, batches: list[dict], acc: dict, replay: bool = False) -> None:
        stats = self.learner.update(batches)
        self.learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        self.version += 1
        steps = sum(len(b["rewards"]) for b in batches)
        if replay:
            acc["replays"] += 1
        else:
            self.total_steps += steps
            acc["steps"] += steps
            metrics.ENV_STEPS.inc(steps)
            for b in batches:
                self.note_episodes(b)
        acc["updates"] += 1
        for name in ("policy_loss", "value_loss", "entropy", "kl", "gradient_noise_scale",
                     *DIAGNOSTICS.values()):
            acc["sums"][name] = acc["sums"].get(name, 0.0) + float(getattr(stats, name))

    # -- the loop -------------------------------------------------------------------------
    def _new_acc(self) -> dict:
        return {"notes": [], "lags": [], "late": 0, "steps": 0, "updates": 0, "replays": 0, "replay_credit": 0,
                "sums": {}, "t": time.time(), "entries": []}

    def _loop(self, resume: bool):
        spec = self.spec
        rnd = self.open_async(resume)
        if isinstance(rnd, tuple):
            return rnd
        k = self.next_round
        empty_rounds = 0
        carried: dict[str, float] = {}  # learner CPU of the last checkpoint + evaluation (cloud clock)
        while True:
            phases: dict[str, float] = {}
            cloud = {"carried": sum(carried.values())}  # the same phases on the cloud clock (docs/cost.md)
            acc = self._new_acc()
            metrics.set_job(metrics.CURRENT_ROUND, self.job.job_id, k)
            self._train_until_closed(rnd, acc, phases, cloud)
            rejected, duplicates = self.export_reader_counters()
            if self.job.stop_requested.is_set():
                return training_pb2.JOB_STATE_STOPPED, f"stopped: {self.job.stop_reason}"
            if acc["steps"] == 0 and rnd["batches"] == 0:
                empty_rounds += 1
                if empty_rounds >= MAX_EMPTY_ROUNDS:
                    return training_pb2.JOB_STATE_FAILED, f"no samples arrived in {MAX_EMPTY_ROUNDS} consecutive rounds"
                rnd = self._launch_round(k, rnd["actors"])  # the same round again, fresh invocation ids
                continue
            empty_rounds = 0
            # Close round k: publish and score the latest policy, plan and launch k+1 at once.
            with metrics.timed("publish", phases, cloud):
                self.publish()
                ref = self.write_sample_subset(k) if self.learner.last_data is not None else ""
            with metrics.timed("detect", phases):
                score_resp, fallback = self.score_or_fallback(k, ref, "impact", acc["notes"])
            cloud["detect"] = score_resp.cpu_seconds
            n = max(acc["updates"], 1)
            means = {name: v / n for name, v in acc["sums"].items()}
            last = self.async_plan_inputs(means, cloud)
            with metrics.timed("plan", phases):
                next_plan = self.plan(k + 1, score_resp.score, means.get("gradient_noise_scale", 0.0), fallback, last,
                                      cloud_seconds=cloud_round_seconds(cloud))
            ending = k + 1 >= spec.rounds or next_plan.budget_exhausted
            if not ending:
                with metrics.timed("invoke", phases):
                    next_rnd = self._launch_round(k + 1, next_plan.actors)
            pending = self.async_pending(k, self._fields(k, rnd, acc, means, rejected, duplicates),
                                         score_resp=score_resp, next_plan=next_plan, notes=self._notes(acc),
                                         fallback=fallback, cloud=cloud, phases=phases, started=acc["t"],
                                         ending=ending)
            # Commit and evaluation overlap the next round's sampling: on the cloud clock they are
            # learner CPU of the next round ("update"), not of this one.
            carried = {}
            with metrics.timed("publish", phases, carried):
                self.commit(k, pending, acc["entries"])
            end = self.finish_async_round(pending, phases, carried)
            if end is not None:
                return end
            k, rnd = k + 1, next_rnd

    def _fields(self, k, rnd, acc, means, rejected, duplicates) -> dict:
        """The round's RoundReport fields that neither its evaluation nor its closing depend on."""
        resp = rnd["resp"] or scaler_pb2.LaunchResponse()
        return dict(
            round=k, policy_version=rnd["version"], actors_launched=rnd["actors"],
            actors_completed=len(rnd["covered"]), actors_failed=len(rnd["failed"] - rnd["covered"]),
            env_steps=acc["steps"], total_env_steps=self.total_steps,
            policy_loss=means.get("policy_loss", 0.0), value_loss=means.get("value_loss", 0.0),
            entropy=means.get("entropy", 0.0), kl=means.get("kl", 0.0), invocation_retries=resp.retries,
            gradient_noise_scale=means.get("gradient_noise_scale", 0.0),
            **{key: means.get(name, 0.0) for key, name in DIAGNOSTICS.items()},
            kl_coeff=self.learner.kl_coeff, duplicates_dropped=duplicates, rejected_batches=rejected)

    @staticmethod
    def _notes(acc) -> list[str]:
        notes = list(acc["notes"])
        if acc["lags"]:
            notes.append(f"policy lag: mean {np.mean(acc['lags']):.1f}, max {max(acc['lags'])} versions; "
                         f"{acc['updates']} updates ({acc['replays']} replayed), {acc['late']} late batches")
        return notes
