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

The round's skeleton is PipelinedLoop's (pipelined.py); this loop supplies its
pump (`sample_round`: learn while the round samples) and its report's fields.

Durability: the batches a round learned from stay unacknowledged until the
round is committed (RoundLoop.commit, after it closed). A learner killed before
that learns from them again after a resume (what it had learned died with it);
the replay buffer is not checkpointed, replayed updates are not counted as
steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from learner_svc.constants import MAX_REPLAYS_PER_FRESH, PIPELINED_READ
from learner_svc.pipelined import OpenRound, PipelinedLoop
from learner_svc.policy_owner import GradientLearner
from learner_svc.reporting import DIAGNOSTICS
from learner_svc.state import Ingest, Round, RoundStats
from nitro.algos.impact import IMPACTLearner
from nitro.algos.replay import ReplayBuffer
from nitro.rpc import metrics

log = logging.getLogger(__name__)


@dataclass
class OffPolicyStats(RoundStats):
    """What an IMPACT round counts while it is open."""

    lags: list[int] = field(default_factory=list)  # policy lag of every fresh batch
    updates: int = 0
    replays: int = 0  # of the updates, those on replayed batches
    replay_credit: int = 0  # replay updates still allowed
    entries: list = field(default_factory=list)  # learned from, acked when the round's commit holds it
    rejected: int = 0  # stream payloads rejected while the round was open
    duplicates: int = 0

    def means(self) -> dict[str, float]:
        return self.means_over(self.updates)


class OffPolicyLoop(PipelinedLoop[OffPolicyStats]):
    learner_class = IMPACTLearner
    learner: GradientLearner
    # Versions are published once a round, at its close: the newest serves the round sampling now, the one
    # before the closed round's stragglers, and one more those of the round before (late data is still used).
    keep_versions = 3

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.replay = ReplayBuffer(self.cfg.replay_capacity, self.cfg.replay_max_reuse, seed=self.spec.seed)

    # -- learning while sampling -------------------------------------------------------------
    def sample_round(self, k: int) -> OpenRound[OffPolicyStats]:
        rnd = OpenRound(self.launched, OffPolicyStats(), cloud={"carried": sum(self.carried.values())})
        self._train_until_closed(rnd.launch, rnd.stats, rnd.phases, rnd.cloud)
        rnd.stats.rejected, rnd.stats.duplicates = self.export_reader_counters(rnd.stats.notes)
        return rnd

    def _train_until_closed(self, rnd: Round, acc: OffPolicyStats, phases: dict, cloud: dict) -> None:
        """Update on every arriving batch of this job, replay when idle, until `rnd` closes.

        On the cloud clock the round's actors and the learner run in parallel: the learner's CPU
        time is "update", and "sample" is only what the slowest actor takes beyond it."""

        def learn(entries, pumped) -> None:
            fresh = []
            for e, outcome in entries:
                if outcome is Ingest.DUPLICATE:
                    acc.entries.append(e)  # acked with the round's commit, not learned from twice
                    continue
                # A straggler of an earlier round, or of a round launched before a resume (LATE), is still good data.
                lag = self.version - e.policy_version
                metrics.POLICY_LAG.observe(lag)
                acc.lags.append(lag)
                fresh.append(e)
            acc.late = rnd.late
            if fresh:
                pumped.timed("update", self._update, [e.batch for e in fresh], acc)
                for e in fresh:
                    self.replay.add(e.batch)
                acc.replay_credit += MAX_REPLAYS_PER_FRESH * len(fresh)
                acc.entries.extend(fresh)  # acked when the round's commit holds what was learned
            else:
                replay(pumped)

        def replay(pumped) -> None:
            if acc.replay_credit > 0 and len(self.replay) and (replayed := self.replay.sample(1)):
                pumped.timed("update", self._update, replayed, acc, True)
                acc.replay_credit -= 1

        pumped = self.collector.pump(rnd, rnd.closed, learn, read=PIPELINED_READ, notes=acc.notes, on_idle=replay)
        metrics.observe_phase("update", pumped.counted.get("update", 0.0), phases)
        metrics.observe_phase("ingest", pumped.ingest, phases)
        metrics.observe_phase("sample", pumped.sample(), phases)
        sampling = rnd.wave.resp.cloud_seconds if rnd.wave.resp is not None else 0.0
        busy = pumped.cpu + cloud.pop("carried", 0.0)  # the previous round's checkpoint and evaluation ran meanwhile
        cloud["update"] = busy
        cloud["sample"] = max(0.0, sampling - busy)

    def _update(self, batches: list[dict], acc: OffPolicyStats, replay: bool = False) -> None:
        stats = self.learner.update(batches)
        self.learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        self.version += 1
        steps = sum(len(b["rewards"]) for b in batches)
        if replay:
            acc.replays += 1
        else:
            self.total_steps += steps
            acc.steps += steps
            metrics.ENV_STEPS.inc(steps)
            for b in batches:
                self.note_episodes(b)
        acc.updates += 1
        for name in ("policy_loss", "value_loss", "entropy", "kl", "gradient_noise_scale",
                     *DIAGNOSTICS.values()):
            acc.add(name, float(getattr(stats, name)))

    # -- closing -------------------------------------------------------------------------------
    def pending_parts(self, k: int, rnd: OpenRound[OffPolicyStats]) -> tuple[dict, list[str], dict]:
        return self._fields(k, rnd), self._notes(rnd.stats), {}

    def settlement(self, rnd: OpenRound[OffPolicyStats]) -> tuple[list, None]:
        return rnd.stats.entries, None

    def _fields(self, k: int, rnd: OpenRound[OffPolicyStats]) -> dict:
        """The round's RoundReport fields that neither its evaluation nor its closing depend on."""
        acc, means = rnd.stats, rnd.stats.means()
        return dict(
            **rnd.launch.summary().report_fields(k), env_steps=acc.steps, total_env_steps=self.total_steps,
            policy_loss=means.get("policy_loss", 0.0), value_loss=means.get("value_loss", 0.0),
            entropy=means.get("entropy", 0.0), kl=means.get("kl", 0.0),
            gradient_noise_scale=means.get("gradient_noise_scale", 0.0),
            **{key: means.get(name, 0.0) for key, name in DIAGNOSTICS.items()},
            kl_coeff=self.learner.kl_coeff, duplicates_dropped=acc.duplicates, rejected_batches=acc.rejected)

    @staticmethod
    def _notes(acc: OffPolicyStats) -> list[str]:
        notes = list(acc.notes)
        if acc.lags:
            notes.append(f"policy lag: mean {np.mean(acc.lags):.1f}, max {max(acc.lags)} versions; "
                         f"{acc.updates} updates ({acc.replays} replayed), {acc.late} late batches")
        return notes
