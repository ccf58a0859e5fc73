"""Cost model (paper 8.1): prices as configuration, bills as pure functions, a per-job ledger.

Serverless: the learner server by the hour (pro rata), Lambda actors per
GB-second of billed duration (rounded up to the ms; 1 GB = 1024 MB) plus a
per-request fee, and provisioned concurrency per GB-second while configured
(invocations served by provisioned instances pay the lower provisioned
duration rate: paper footnote 3).

Serverful comparator: a fleet of actor VMs sized for I_max (one actor per
vCPU, as in paper 2.4), started at the beginning of the job. The job pays the
VM startup time too, during which the learner waits (paper Fig. 5: VMs take
tens of seconds to minutes to start, Lambda seconds). EC2 Linux bills per
second with a 60 s minimum ("per_second", default); "per_hour" rounds every
VM's run up to whole hours (the older scheme; an upper bound).

Two clocks (docs/cost.md). "This machine": billed durations are the wall time
the local endpoint measured and the learner server is billed for its wall
time, so on a shared 2-core machine a round with more actors takes (and
costs) proportionally longer. "Cloud": what the same work would take on AWS
with every invocation on its own vCPU: an invocation lasts its CPU time plus
the wall time of its Redis calls (`modelled_invocation_ms`), a cold one adds
the platform's start and its init CPU; a round lasts its slowest invocation
plus the learner's critical path measured in CPU time
(`cloud_round_seconds`), and the learner server is billed for that.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from nitro.errors import ConfigError

MB_PER_GB = 1024.0
VM_BILLING = ("per_second", "per_hour")


@dataclass(frozen=True)
class Prices:
    """Unit prices in USD (defaults: the paper's, AWS us-east-2)."""

    learner_usd_per_hour: float = 3.06  # p3.2xlarge
    lambda_usd_per_gb_second: float = 0.0000166667
    lambda_usd_per_million_requests: float = 0.20
    provisioned_usd_per_gb_second: float = 0.0000041667  # while configured, used or not
    provisioned_duration_usd_per_gb_second: float = 0.0000097222  # duration on provisioned instances
    provisioned_billing_increment_s: float = 300.0  # AWS rounds a configured period up to 5 minutes
    actor_vm_name: str = "c5.4xlarge"
    actor_vm_usd_per_hour: float = 0.68
    actor_vm_vcpus: int = 16
    actors_per_vcpu: int = 1
    actor_vm_startup_s: float = 60.0
    actor_vm_billing: str = "per_second"
    actor_vm_min_billed_s: float = 60.0  # per-second billing minimum per VM start
    # Platform timing of the cloud clock (not prices, but they set the modelled bill):
    lambda_cold_start_s: float = 0.25  # sandbox start before a cold function's init code runs (not billed)
    lambda_invoke_overhead_s: float = 0.03  # request round trip of one synchronous invoke (not billed)
    lambda_init_ms: float = 300.0  # init CPU of a cold function until one was measured (billed, as AWS does)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "actor_vm_name":
                if not isinstance(v, str) or not v:
                    raise ConfigError(f"invalid value for prices.{f.name}: must be a non-empty string")
            elif f.name == "actor_vm_billing":
                if v not in VM_BILLING:
                    raise ConfigError(f"invalid value for prices.{f.name}: must be one of {list(VM_BILLING)}, "
                                      f"got {v!r}")
            elif f.name in ("actor_vm_vcpus", "actors_per_vcpu"):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ConfigError(f"invalid value for prices.{f.name}: must be an integer >= 1, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"invalid value for prices.{f.name}: must be a finite number >= 0, got {v!r}")

    @classmethod
    def from_mapping(cls, d: Mapping | None) -> "Prices":
        """Defaults overridden by `d` (e.g. a YAML section); unknown keys are an error."""
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown price setting(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check(field: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"invalid value for {field}: must be a finite number >= 0, got {v!r}")
    return float(v)


def billed_duration_ms(duration_ms: float) -> int:
    """Lambda bills duration rounded up to the next millisecond (at least 1 ms)."""
    return max(1, math.ceil(_check("duration_ms", duration_ms)))


def lambda_cost(total_billed_ms: float, invocations: int, memory_mb: float, prices: Prices, *,
                provisioned: bool = False) -> float:
    """Duration (GB-seconds x rate) plus request fees for `invocations` whose billed ms sum to total_billed_ms."""
    gb_s = _check("billed_ms", total_billed_ms) / 1000.0 * _check("memory_mb", memory_mb) / MB_PER_GB
    rate = prices.provisioned_duration_usd_per_gb_second if provisioned else prices.lambda_usd_per_gb_second
    return gb_s * rate + _check("invocations", invocations) * prices.lambda_usd_per_million_requests / 1e6


def lambda_invocation_cost(billed_ms: float, memory_mb: float, prices: Prices, *, provisioned: bool = False) -> float:
    """One invocation; a fractional billed_ms is rounded up as Lambda would."""
    return lambda_cost(math.ceil(_check("billed_ms", billed_ms)), 1, memory_mb, prices, provisioned=provisioned)


def learner_cost(seconds: float, prices: Prices) -> float:
    return _check("seconds", seconds) / 3600.0 * prices.learner_usd_per_hour


def provisioned_concurrency_cost(concurrency: int, memory_mb: float, seconds: float, prices: Prices, *,
                                 round_up: bool = True) -> float:
    """Keeping `concurrency` instances configured for `seconds` (rounded up to the billing increment)."""
    s = _check("seconds", seconds)
    inc = prices.provisioned_billing_increment_s
    if round_up and inc > 0 and s > 0:
        s = math.ceil(s / inc) * inc
    gb = _check("memory_mb", memory_mb) / MB_PER_GB
    return _check("concurrency", concurrency) * gb * s * prices.provisioned_usd_per_gb_second


def serverful_vm_count(i_max: int, prices: Prices) -> int:
    """VMs needed to host I_max actors (one actor per vCPU by default)."""
    if isinstance(i_max, bool) or not isinstance(i_max, int) or i_max < 1:
        raise ConfigError(f"invalid value for i_max: must be an integer >= 1, got {i_max!r}")
    return math.ceil(i_max / (prices.actor_vm_vcpus * prices.actors_per_vcpu))


def serverful_round_cost(round_seconds: float, i_max: int, prices: Prices, *, include_learner: bool = True) -> float:
    """Marginal cost of one round of a running serverful job (pro rata, no startup, no rounding)."""
    hours = _check("round_seconds", round_seconds) / 3600.0
    vms = serverful_vm_count(i_max, prices) * hours * prices.actor_vm_usd_per_hour
    return vms + (learner_cost(round_seconds, prices) if include_learner else 0.0)


def serverful_job_cost(job_seconds: float, i_max: int, prices: Prices, *, include_learner: bool = True) -> float:
    """A whole serverful job: the VM fleet billed for startup + job time (see module doc), learner included."""
    run = _check("job_seconds", job_seconds) + prices.actor_vm_startup_s
    if prices.actor_vm_billing == "per_hour":
        billed = math.ceil(run / 3600.0) * 3600.0
    else:
        billed = max(run, prices.actor_vm_min_billed_s)
    vms = serverful_vm_count(i_max, prices) * billed / 3600.0 * prices.actor_vm_usd_per_hour
    return vms + (learner_cost(run, prices) if include_learner else 0.0)


def estimate_round_cost(actors: int, expected_billed_ms: float, memory_mb: float, learner_seconds: float,
                        prices: Prices, *, provisioned: bool = False) -> float:
    """Planned cost of a round: `actors` invocations of expected_billed_ms each plus the learner's time."""
    per_actor = lambda_invocation_cost(expected_billed_ms, memory_mb, prices, provisioned=provisioned)
    return _check("actors", actors) * per_actor + learner_cost(learner_seconds, prices)


@dataclass(frozen=True)
class RoundCost:
    actor_usd: float
    learner_usd: float
    provisioned_usd: float
    serverful_usd: float
    invocations: int
    billed_ms: int

    @property
    def total_usd(self) -> float:
        return self.actor_usd + self.learner_usd + self.provisioned_usd

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), total_usd=self.total_usd)


@dataclass(frozen=True)
class CostLedger:
    """Cumulative cost of a job; add_round returns a new ledger (the service stores to_dict() in Redis)."""

    rounds: int = 0
    invocations: int = 0
    billed_ms: int = 0
    actor_usd: float = 0.0
    learner_usd: float = 0.0
    provisioned_usd: float = 0.0
    wall_seconds: float = 0.0
    serverful_usd: float = 0.0  # what the same rounds would have cost on the serverful comparator

    @property
    def total_usd(self) -> float:
        return self.actor_usd + self.learner_usd + self.provisioned_usd

    def add_round(self, *, invocations: int, billed_ms: int, memory_mb: float, round_seconds: float, i_max: int,
                  prices: Prices, provisioned: bool = False,
                  provisioned_concurrency: int = 0) -> tuple["CostLedger", RoundCost]:
        """Account one round: actors' billed ms, the learner server for the round's wall time,
        provisioned concurrency held during it, and the serverful comparator's increment."""
        actor = lambda_cost(billed_ms, invocations, memory_mb, prices, provisioned=provisioned)
        learner = learner_cost(round_seconds, prices)
        pc = provisioned_concurrency_cost(provisioned_concurrency, memory_mb, round_seconds, prices, round_up=False)
        # Difference of whole-job bills, so startup and billing granularity land exactly once.
        before = serverful_job_cost(self.wall_seconds, i_max, prices) if self.rounds else 0.0
        serverful = serverful_job_cost(self.wall_seconds + round_seconds, i_max, prices) - before
        rc = RoundCost(actor, learner, pc, serverful, int(invocations), int(billed_ms))
        return CostLedger(self.rounds + 1, self.invocations + int(invocations), self.billed_ms + int(billed_ms),
                          self.actor_usd + actor, self.learner_usd + learner, self.provisioned_usd + pc,
                          self.wall_seconds + float(round_seconds), self.serverful_usd + serverful), rc

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), total_usd=self.total_usd)

    @classmethod
    def from_dict(cls, d: Mapping) -> "CostLedger":
        d = {k: v for k, v in d.items() if k != "total_usd"}  # derived, written by to_dict
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown cost ledger field(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)


# -- the cloud clock (docs/cost.md) -------------------------------------------------------

CLOCKS = ("cloud", "machine")  # which bill a job's budget binds on; "cloud" by default


def modelled_invocation_ms(cpu_ms: float, io_cpu_ms: float, io_wall_ms: float) -> float:
    """An invocation's duration with a vCPU of its own: CPU time outside Redis calls plus the
    wall time of its Redis calls (waiting on the network is billed on Lambda, too)."""
    cpu, io_cpu, io_wall = (_check(n, v) for n, v in
                            (("cpu_ms", cpu_ms), ("io_cpu_ms", io_cpu_ms), ("io_wall_ms", io_wall_ms)))
    return max(0.0, cpu - io_cpu) + io_wall


def modelled_billed_ms(modelled_ms: float, init_ms: float = 0.0) -> int:
    """Billed ms of one modelled invocation: its duration plus, when cold, its init
    (AWS bills the INIT phase of on-demand functions), rounded up to the ms."""
    return billed_duration_ms(_check("modelled_ms", modelled_ms) + _check("init_ms", init_ms))


def modelled_invocation_seconds(modelled_ms: float, init_ms: float, cold: bool, prices: Prices) -> float:
    """Wall time of one invocation on the cloud, as its caller sees it (init_ms counts only when cold)."""
    start = prices.lambda_cold_start_s + _check("init_ms", init_ms) / 1000.0 if cold else 0.0
    return prices.lambda_invoke_overhead_s + start + _check("modelled_ms", modelled_ms) / 1000.0


def cold_invocations(launched: int, warm_sandboxes: int) -> int:
    """How many of a launch start cold: Lambda reuses idle sandboxes, so a launch needs new ones only
    beyond the most that earlier launches of the job kept warm (idle sandboxes live minutes; rounds
    are seconds apart)."""
    return max(0, int(launched) - max(0, int(warm_sandboxes)))


def cloud_launch(invocations, prices: Prices) -> tuple[float, list[int]]:
    """A launch of (modelled_ms, init_ms, cold) invocations, all in parallel: its modelled wall time
    (the slowest, 0 when empty) and each one's modelled billed ms."""
    invocations = list(invocations)
    seconds = max((modelled_invocation_seconds(ms, init, cold, prices) for ms, init, cold in invocations),
                  default=0.0)
    return seconds, [modelled_billed_ms(ms, init if cold else 0.0) for ms, init, cold in invocations]


def cloud_detect_wait(detector_cpu_s: float, overlapped_s: float) -> float:
    """The learner waits for the detector only as long as its scoring outlasts the work it overlaps."""
    return max(0.0, _check("detector_cpu_s", detector_cpu_s) - _check("overlapped_s", overlapped_s))


def cloud_round_seconds(phases: Mapping[str, float]) -> float:
    """A round on the cloud: its modelled phases laid end to end (they are its critical path)."""
    return sum(_check(f"cloud phase {name}", v) for name, v in phases.items())


def budget_spent(machine_usd: float, cloud_usd: float, clock: str) -> float:
    """The bill a job's budget binds on."""
    if clock not in CLOCKS:
        raise ConfigError(f"invalid value for budget_clock: must be one of {list(CLOCKS)}, got {clock!r}")
    return cloud_usd if clock == "cloud" else machine_usd


# -- reference pricing: the cloud model at fixed speeds (docs/cost.md) --------------------

REFERENCE_QUANTILE = 0.10  # calibration takes the quietest decile: load only ever slows work down


@dataclass(frozen=True)
class ReferenceRates:
    """Seconds per unit of work, measured once on a quiet machine. The cloud clock measures CPU time,
    and CPU time still grows when other work shares the cores (caches, SMT siblings, memory bandwidth:
    the PPO update took 0.63 s quiet and 1.3-1.6 s beside a test suite), so a comparison of scaling
    policies at equal dollars prices every run at these rates instead: the same work costs the same
    whenever and wherever it ran."""

    actor_s_per_step: float  # an actor invocation's modelled seconds per env step
    learner_s_per_sample: float  # the learner's ingest + update seconds per sample of the round
    learner_s_per_round: float  # the learner's seconds per round whatever its size (publish, detect)
    actor_init_s: float = 0.3  # the init of a cold invocation (billed, as AWS bills INIT)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f"reference rate {f.name}", getattr(self, f.name))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def reference_round(actors: int, steps_per_actor: int, warm_sandboxes: int, rates: ReferenceRates,
                    prices: Prices, actor_memory_mb: float = 1024.0) -> tuple[float, float]:
    """(seconds, USD) of one training round priced at the reference rates: `actors` equal invocations in
    parallel (those beyond the warm sandboxes start cold), then the learner's ingest, update, publish and
    detect; the learner server is billed for the round. Evaluation is left out: it is the experimenter's
    measurement, the same for every scaling policy."""
    actors, steps = int(actors), int(steps_per_actor)
    if actors < 0 or steps < 0:
        raise ConfigError(f"invalid reference round: actors and steps_per_actor must be >= 0, got {actors}, {steps}")
    cold = cold_invocations(actors, warm_sandboxes)
    run_ms = rates.actor_s_per_step * steps * 1000.0
    launch_s, billed = cloud_launch([(run_ms, rates.actor_init_s * 1000.0, i < cold) for i in range(actors)], prices)
    seconds = launch_s + rates.learner_s_per_sample * actors * steps + rates.learner_s_per_round
    return seconds, learner_cost(seconds, prices) + lambda_cost(sum(billed), actors, actor_memory_mb, prices)


def reference_job(actors_by_round, steps_per_actor: int, rates: ReferenceRates, prices: Prices,
                  actor_memory_mb: float = 1024.0) -> list[float]:
    """The cumulative reference bill (USD) after each round of a job that launched `actors_by_round`."""
    total, warm, out = 0.0, 0, []
    for actors in actors_by_round:
        total += reference_round(actors, steps_per_actor, warm, rates, prices, actor_memory_mb)[1]
        warm = max(warm, int(actors))
        out.append(total)
    return out


def calibrate_reference_rates(rounds, steps_per_actor: int, prices: Prices,
                              quantile: float = REFERENCE_QUANTILE) -> ReferenceRates:
    """Reference rates from round reports that carry `cloud_phases` (any number of runs of one env and
    preset): per unit of work, the `quantile` of what the rounds measured, so rounds slowed by other load
    on the machine do not set the price. Actor speed comes from warm launches only (no cold start)."""
    step, sample, fixed = [], [], []
    warm = {}
    for r in rounds:
        ph, actors = r.get("cloud_phases") or {}, int(r.get("actors_launched") or 0)
        job = r.get("job_id")
        if not ph or actors <= 0:
            continue
        samples = float(r.get("env_steps") or actors * steps_per_actor)
        if actors <= warm.get(job, 0) and steps_per_actor > 0:
            step.append(max(0.0, ph.get("sample", 0.0) - prices.lambda_invoke_overhead_s) / steps_per_actor)
        warm[job] = max(warm.get(job, 0), actors)
        if samples > 0:
            sample.append((ph.get("ingest", 0.0) + ph.get("update", 0.0)) / samples)
        if not r.get("evaluated"):  # an evaluation overlaps the detector, which then looks free
            fixed.append(ph.get("publish", 0.0) + ph.get("detect", 0.0))
    if not step or not sample or not fixed:
        raise ConfigError("calibrate_reference_rates: no round report with cloud_phases after a warm launch "
                          "(needs runs of at least two rounds with the cloud clock)")
    q = float(quantile)
    return ReferenceRates(actor_s_per_step=float(np.quantile(step, q)),
                          learner_s_per_sample=float(np.quantile(sample, q)),
                          learner_s_per_round=float(np.quantile(fixed, q)))
