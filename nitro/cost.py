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

from nitro.contracts import (
    DEFAULT_ACTOR_MEMORY_MB,
    FUNCTION_KINDS,
    LAMBDA_FULL_VCPU_MB,
    eval_episodes_per_function,
    eval_slices,
)
from nitro.errors import ConfigError

MB_PER_GB = 1024.0
VM_BILLING = ("per_second", "per_hour")


@dataclass(frozen=True)
class Prices:
    """Unit prices in USD (defaults: the paper's, AWS us-east-2)."""

    # The learner server is priced as the machine whose speed the cloud clock measures: this machine's CPU
    # (2 vCPUs of an Ice Lake Xeon, what a c6i.large is); a GPU server's price belongs with a GPU-measured update
    # (docs/cost.md). The paper's p3.2xlarge was $3.06/h.
    learner_instance: str = "c6i.large"
    learner_usd_per_hour: float = 0.085
    lambda_usd_per_gb_second: float = 0.0000166667
    lambda_usd_per_million_requests: float = 0.20
    # Memory at which a function gets one full vCPU; below it CPU-bound work runs full/M times longer
    # (`lambda_cpu_slowdown`). 0 models every size as a full vCPU (the model before 2026-12-02).
    lambda_full_vcpu_mb: float = float(LAMBDA_FULL_VCPU_MB)
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
            if f.name in ("actor_vm_name", "learner_instance"):
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


def serverful_job_cost(job_seconds: float, i_max: int, prices: Prices, *, include_learner: bool = True) -> float:
    """A whole serverful job: the VM fleet billed for startup + job time (see module doc), learner included."""
    run = _check("job_seconds", job_seconds) + prices.actor_vm_startup_s
    if prices.actor_vm_billing == "per_hour":
        billed = math.ceil(run / 3600.0) * 3600.0
    else:
        billed = max(run, prices.actor_vm_min_billed_s)
    vms = serverful_vm_count(i_max, prices) * billed / 3600.0 * prices.actor_vm_usd_per_hour
    return vms + (learner_cost(run, prices) if include_learner else 0.0)


# -- the cloud clock (docs/cost.md) -------------------------------------------------------

CLOCKS = ("cloud", "machine")  # which bill a job's budget binds on; "cloud" by default


def modelled_invocation_ms(cpu_ms: float, io_cpu_ms: float, io_wall_ms: float) -> float:
    """An invocation's duration with a vCPU of its own: CPU time outside Redis calls plus the
    wall time of its Redis calls (waiting on the network is billed on Lambda, too)."""
    cpu, io_cpu, io_wall = (_check(n, v) for n, v in
                            (("cpu_ms", cpu_ms), ("io_cpu_ms", io_cpu_ms), ("io_wall_ms", io_wall_ms)))
    return max(0.0, cpu - io_cpu) + io_wall


def lambda_cpu_slowdown(memory_mb: float, prices: Prices) -> float:
    """How much longer CPU-bound work takes in a function of `memory_mb` than on a full vCPU: Lambda allocates
    CPU in proportion to memory, a full vCPU at `prices.lambda_full_vcpu_mb` (1,769 MB). An actor is
    single-threaded, so more memory than that buys nothing (1.0)."""
    m = _check("memory_mb", memory_mb)
    if m <= 0:
        raise ConfigError(f"invalid value for memory_mb: must be > 0, got {memory_mb!r}")
    return max(1.0, prices.lambda_full_vcpu_mb / m)


def lambda_duration_ms(modelled_ms: float, cpu_ms: float, memory_mb: float, prices: Prices) -> float:
    """An invocation's duration at `memory_mb`: its `modelled_ms` on a full vCPU (`modelled_invocation_ms`),
    of which `cpu_ms` is CPU-bound work, slowed by the memory's CPU share; waiting on Redis is not."""
    cpu = min(_check("cpu_ms", cpu_ms), _check("modelled_ms", modelled_ms))
    return modelled_ms + cpu * (lambda_cpu_slowdown(memory_mb, prices) - 1.0)


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


def cloud_round_seconds(phases: Mapping[str, float]) -> float:
    """A round on the cloud: its modelled phases laid end to end (they are its critical path)."""
    return sum(_check(f"cloud phase {name}", v) for name, v in phases.items())


def budget_spent(machine_usd: float, cloud_usd: float, clock: str) -> float:
    """The bill a job's budget binds on."""
    if clock not in CLOCKS:
        raise ConfigError(f"invalid value for budget_clock: must be one of {list(CLOCKS)}, got {clock!r}")
    return cloud_usd if clock == "cloud" else machine_usd


# -- a job's ledger and the plan's estimate (the scaler's bookkeeping) ----------------------

# Guesses for the first round, replaced by what the job measured as soon as it measured anything:
DEFAULT_MS_PER_STEP = 1.0  # billed actor time per env step
FIRST_ROUND_LEARNER_S = 10.0  # learner time of a round
LEARNER_ROUND_MARGIN = 1.5  # the learner's measured time per round is padded by this: a round that runs long
# must still be affordable


@dataclass(frozen=True)
class Charge:
    """What one billed event adds to a job's ledger: `amounts` maps ledger fields to increments (int for counts,
    float for seconds and dollars); `usd` and `cloud_usd` are its dollars on each clock, `cloud_seconds` its
    modelled wall time (an invocation's, as its caller waits for it)."""

    amounts: Mapping[str, int | float]
    usd: float
    cloud_usd: float
    cloud_seconds: float = 0.0


@dataclass(frozen=True)
class Bill:
    """A job's bill on one clock so far (USD), and the serverful comparator over the same learner time."""

    actor_usd: float
    learner_usd: float
    learner_fn_usd: float
    seconds: float  # learner time billed
    serverful_usd: float
    eval_fn_usd: float = 0.0  # evaluation functions (TrainingSpec.evaluation "functions")

    @property
    def total_usd(self) -> float:
        return self.actor_usd + self.learner_usd + self.learner_fn_usd + self.eval_fn_usd


@dataclass(frozen=True)
class CostLedger:
    """A job's cumulative bill on both clocks, as counters that only grow. The field names are those the scaler
    keeps in the job's Redis hash: it adds a Charge's amounts with HINCRBY / HINCRBYFLOAT (atomic across
    replicas) and reads the ledger back with from_fields; `add` is the same in memory."""

    # this machine's clock
    actor_cost_usd: float = 0.0
    invocations: int = 0
    billed_ms: int = 0
    steps_billed: int = 0  # env steps of the actor invocations that succeeded
    learner_fn_cost_usd: float = 0.0
    learner_fn_invocations: int = 0
    learner_fn_billed_ms: int = 0
    eval_fn_cost_usd: float = 0.0  # evaluation functions
    eval_fn_invocations: int = 0
    eval_fn_billed_ms: int = 0
    learner_cost_usd: float = 0.0  # the learner server
    wall_seconds: float = 0.0  # the learner server's billed time
    # the cloud clock (counts of invocations and steps are the same on both)
    cloud_actor_cost_usd: float = 0.0
    cloud_billed_ms: int = 0
    cloud_learner_fn_cost_usd: float = 0.0
    cloud_learner_fn_billed_ms: int = 0
    cloud_eval_fn_cost_usd: float = 0.0
    cloud_eval_fn_billed_ms: int = 0
    cloud_learner_cost_usd: float = 0.0
    cloud_seconds: float = 0.0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The ledger's counters: the hash fields from_fields reads (what a reader asks Redis for)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_fields(cls, fields: Mapping) -> "CostLedger":
        """The ledger in a stored hash (str or bytes keys and values); a missing counter is 0 and the hash's
        other fields are not the ledger's."""
        values = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        out = {}
        for f in dataclasses.fields(cls):
            v = values.get(f.name)
            if v is not None:
                v = v.decode() if isinstance(v, bytes) else v
                out[f.name] = int(v) if f.type == "int" else float(v)
        return cls(**out)

    def add(self, charge: Charge) -> "CostLedger":
        unknown = sorted(set(charge.amounts) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(f"unknown cost ledger field(s) {unknown}")
        return dataclasses.replace(self, **{k: getattr(self, k) + v for k, v in charge.amounts.items()})

    def bill(self, clock: str, i_max: int, prices: Prices) -> Bill:
        """The bill on `clock` ("cloud" or "machine"); the comparator is a fleet for i_max actors."""
        if clock not in CLOCKS:
            raise ConfigError(f"invalid value for clock: must be one of {list(CLOCKS)}, got {clock!r}")
        p = "cloud_" if clock == "cloud" else ""
        seconds = self.cloud_seconds if clock == "cloud" else self.wall_seconds
        return Bill(getattr(self, f"{p}actor_cost_usd"), getattr(self, f"{p}learner_cost_usd"),
                    getattr(self, f"{p}learner_fn_cost_usd"), seconds, serverful_job_cost(seconds, i_max, prices),
                    getattr(self, f"{p}eval_fn_cost_usd"))

    def budget_left(self, budget_usd: float, clock: str) -> float:
        """The budget minus the bill `clock` names (the one a job's budget binds on)."""
        return budget_usd - budget_spent(self._spent(""), self._spent("cloud_"), clock)

    def _spent(self, p: str) -> float:
        """Every component of the bill whose fields start with `p` ("" this machine, "cloud_" the cloud)."""
        return sum(getattr(self, f"{p}{c}_cost_usd") for c in ("actor", "learner", "learner_fn", "eval_fn"))


def learner_charge(seconds: float, cloud_seconds: float, prices: Prices) -> Charge:
    """The learner server's time since the job's last plan, on this machine and on the cloud clock."""
    usd, cloud_usd = learner_cost(seconds, prices), learner_cost(cloud_seconds, prices)
    return Charge({"learner_cost_usd": usd, "wall_seconds": float(seconds), "cloud_learner_cost_usd": cloud_usd,
                   "cloud_seconds": float(cloud_seconds)}, usd, cloud_usd)


def invocation_charge(kind: str, *, requests: int, billed_ms: int, modelled_ms: float, cpu_ms: float,
                      init_ms: float, cold: bool, steps: int, memory_mb: float, prices: Prices) -> Charge:
    """One invocation, all its attempts: `requests` that reached the platform, their `billed_ms` (this machine)
    and `modelled_ms` (the cloud clock on a full vCPU, of which `cpu_ms` is CPU-bound, plus `init_ms` when
    `cold`), and the env `steps` it delivered (0 when it failed; counted for actors only). The cloud clock runs
    the CPU-bound work (and the init) at the CPU share of `memory_mb` (`lambda_cpu_slowdown`). Learner functions
    and evaluation functions are billed at the same prices in counters of their own, so the actors' cost per
    step stays theirs. An invocation that never reached the platform costs nothing."""
    if kind not in FUNCTION_KINDS:
        raise ConfigError(f"invalid value for kind: must be one of {list(FUNCTION_KINDS)}, got {kind!r}")
    slow = lambda_cpu_slowdown(memory_mb, prices)
    seconds, [cloud_ms] = cloud_launch([(lambda_duration_ms(modelled_ms, cpu_ms, memory_mb, prices),
                                         _check("init_ms", init_ms) * slow, cold)], prices)
    cloud_ms = cloud_ms if requests else 0
    usd = lambda_cost(billed_ms, requests, memory_mb, prices)
    cloud_usd = lambda_cost(cloud_ms, requests, memory_mb, prices) if requests else 0.0
    if kind == "actor":
        amounts = {"actor_cost_usd": usd, "invocations": int(requests), "billed_ms": int(billed_ms),
                   "cloud_actor_cost_usd": cloud_usd, "cloud_billed_ms": cloud_ms}
        if steps:
            amounts["steps_billed"] = int(steps)
    else:
        p = "learner_fn" if kind == "learner" else "eval_fn"
        amounts = {f"{p}_cost_usd": usd, f"{p}_invocations": int(requests), f"{p}_billed_ms": int(billed_ms),
                   f"cloud_{p}_cost_usd": cloud_usd, f"cloud_{p}_billed_ms": cloud_ms}
    return Charge(amounts, usd, cloud_usd, seconds)


@dataclass(frozen=True)
class RoundEstimate:
    """What a planned round will cost: `fixed_usd` (the learner server) plus `per_actor_usd` per actor; and
    `reserve_usd`, what the budget must still hold after it: the job's final evaluation (`evaluation_reserve`)."""

    per_actor_usd: float
    fixed_usd: float
    reserve_usd: float = 0.0

    def cost_usd(self, actors: int) -> float:
        return self.per_actor_usd * actors + self.fixed_usd


def _ms_per_step(ledger: CostLedger, cloud: bool) -> float:
    """An actor's billed ms per env step so far (DEFAULT_MS_PER_STEP until an actor succeeded)."""
    billed = ledger.cloud_billed_ms if cloud else ledger.billed_ms
    return billed / ledger.steps_billed if ledger.steps_billed > 0 else DEFAULT_MS_PER_STEP


def evaluation_reserve(ledger: CostLedger, clock: str, *, episodes: int, episode_steps: int, memory_mb: float,
                       prices: Prices, init_ms: float = 0.0) -> float:
    """What the job's final evaluation may cost on `clock`: `episodes` run by evaluation functions
    (nitro.contracts.eval_slices), each function billed as a cold start (`init_ms`, at the CPU share of
    `memory_mb` on the cloud clock, as `invocation_charge` bills it) plus the job's mean actor invocation (policy,
    env) plus its episodes run to the env's step limit (`episode_steps`) at the actors' billed ms per step, or as
    the mean evaluation function so far, the larger. 0 with no episodes. It is billed after the plan that ends the
    job, so every plan keeps it back; with `episode_steps` 0 (an env without a step limit) only the measured mean
    counts, and before any evaluation ran nothing is kept."""
    _check("episodes", episodes)
    _check("episode_steps", episode_steps)
    _check("init_ms", init_ms)
    if episodes <= 0:
        return 0.0
    cloud = clock == "cloud"
    per_function = eval_episodes_per_function(episodes)
    functions = len(eval_slices(episodes, per_function))
    billed = ledger.cloud_billed_ms if cloud else ledger.billed_ms
    start_ms = billed / ledger.invocations if ledger.invocations else 0.0
    cold_ms = init_ms * (lambda_cpu_slowdown(memory_mb, prices) if cloud else 1.0)
    steps_ms = _ms_per_step(ledger, cloud) * per_function * episode_steps
    modelled = lambda_invocation_cost(cold_ms + start_ms + steps_ms, memory_mb, prices) if episode_steps > 0 else 0.0
    eval_usd = ledger.cloud_eval_fn_cost_usd if cloud else ledger.eval_fn_cost_usd
    measured = eval_usd / ledger.eval_fn_invocations if ledger.eval_fn_invocations else 0.0
    return functions * max(modelled, measured)


def estimate_round(ledger: CostLedger, clock: str, *, rounds_planned: int, last_learner_seconds: float,
                   steps_per_actor: int, memory_mb: float, prices: Prices, final_eval_episodes: int = 0,
                   eval_episode_steps: int = 0, eval_init_ms: float = 0.0) -> RoundEstimate:
    """The next round's cost on the budget's `clock`, from what the job measured so far: an actor's billed ms
    per env step (DEFAULT_MS_PER_STEP until an actor succeeded), plus each learner function's mean cost
    (stellaris: one per actor's batch); the learner's time per round padded by LEARNER_ROUND_MARGIN (its mean
    over the `rounds_planned` rounds or its latest, `last_learner_seconds`, the larger; FIRST_ROUND_LEARNER_S
    before the first plan), plus the evaluation functions' mean bill per round so far; and the reserve for the
    job's final evaluation (`evaluation_reserve` of `final_eval_episodes`, `eval_episode_steps`, `eval_init_ms`)."""
    if clock not in CLOCKS:
        raise ConfigError(f"invalid value for clock: must be one of {list(CLOCKS)}, got {clock!r}")
    cloud = clock == "cloud"
    seconds = ledger.cloud_seconds if cloud else ledger.wall_seconds
    learner_s = (LEARNER_ROUND_MARGIN * max(seconds / rounds_planned, _check("last_learner_seconds",
                                                                             last_learner_seconds))
                 if rounds_planned > 0 else FIRST_ROUND_LEARNER_S)
    per_actor = lambda_invocation_cost(_ms_per_step(ledger, cloud) * max(1, steps_per_actor), memory_mb, prices)
    if ledger.learner_fn_invocations:
        fn_usd = ledger.cloud_learner_fn_cost_usd if cloud else ledger.learner_fn_cost_usd
        per_actor += fn_usd / ledger.learner_fn_invocations
    # Evaluation functions (docs/evaluation.md) are billed after the round they evaluate was planned: the mean per
    # round so far goes into the fixed part, so a budget also pays for the evaluations its rounds bring.
    eval_usd = ledger.cloud_eval_fn_cost_usd if cloud else ledger.eval_fn_cost_usd
    per_round_eval = eval_usd / rounds_planned if rounds_planned > 0 else 0.0
    reserve = evaluation_reserve(ledger, clock, episodes=final_eval_episodes, episode_steps=eval_episode_steps,
                                 memory_mb=memory_mb, prices=prices, init_ms=eval_init_ms)
    return RoundEstimate(per_actor, learner_cost(learner_s, prices) + per_round_eval, reserve)


def round_and_sample_costs(per_actor_usd: float, round_seconds: float, update_seconds: float, env_steps: int,
                           steps_per_actor: int, prices: Prices) -> tuple[float, float]:
    """(a, c): what a round costs whatever its size and what one more sample costs, from the last round on the
    cloud clock (the "noise" scaling policy). The learner server is billed for the whole round, but only its
    update grows with the samples: a = the learner's round less its update; c = an actor's cost per step plus
    the update's cost per sample. (0, 0) when the last round is unknown (no steps, no round time)."""
    for name, x in (("per_actor_usd", per_actor_usd), ("round_seconds", round_seconds),
                    ("update_seconds", update_seconds)):
        _check(name, x)
    if env_steps <= 0 or steps_per_actor <= 0 or round_seconds <= 0:
        return 0.0, 0.0
    update = min(update_seconds, round_seconds)
    a = learner_cost(round_seconds - update, prices)
    c = per_actor_usd / steps_per_actor + learner_cost(update, prices) / env_steps
    return a, c


# -- reference pricing: the cloud model at fixed speeds (docs/cost.md) --------------------

# What the reports of runs before 2026-12-02 were billed at: the paper's GPU learner price for CPU-measured time,
# and 1,024 MB actors modelled on a full vCPU. Calibrating old reports needs them (an old bill is read back in
# their units); pricing with them reproduces the old tables (the "old" pricing).
PAPER_PRICES = Prices(learner_instance="p3.2xlarge", learner_usd_per_hour=3.06, lambda_full_vcpu_mb=0.0)
LEGACY_ACTOR_MEMORY_MB = 1024

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
                    prices: Prices, actor_memory_mb: float = float(DEFAULT_ACTOR_MEMORY_MB), *,
                    asynchronous: bool = False, evaluation_s: float = 0.0) -> tuple[float, float]:
    """(seconds, USD) of one training round priced at the reference rates: `actors` equal invocations in
    parallel (those beyond the warm sandboxes start cold; their CPU-bound work at the CPU share of
    `actor_memory_mb`), then the learner's ingest, update, publish and detect, then `evaluation_s` of
    evaluation on the learner; the learner server is billed for the round. `asynchronous` (IMPACT): the update
    runs while the actors sample, so the round takes the longer of the launch and the update, then publish and
    detect."""
    actors, steps = int(actors), int(steps_per_actor)
    if actors < 0 or steps < 0:
        raise ConfigError(f"invalid reference round: actors and steps_per_actor must be >= 0, got {actors}, {steps}")
    slow = lambda_cpu_slowdown(actor_memory_mb, prices)
    cold = cold_invocations(actors, warm_sandboxes)
    run_ms = rates.actor_s_per_step * steps * 1000.0 * slow
    launch_s, billed = cloud_launch([(run_ms, rates.actor_init_s * 1000.0 * slow, i < cold) for i in range(actors)],
                                    prices)
    update_s = rates.learner_s_per_sample * actors * steps
    seconds = ((max(launch_s, update_s) if asynchronous else launch_s + update_s) + rates.learner_s_per_round
               + _check("evaluation_s", evaluation_s))
    return seconds, learner_cost(seconds, prices) + lambda_cost(sum(billed), actors, actor_memory_mb, prices)


def reference_job(actors_by_round, steps_per_actor: int, rates: ReferenceRates, prices: Prices,
                  actor_memory_mb: float = float(DEFAULT_ACTOR_MEMORY_MB), *, asynchronous: bool = False,
                  evaluation_s=None) -> list[float]:
    """The cumulative reference bill (USD) after each round of a job that launched `actors_by_round`
    (`evaluation_s`: each round's evaluation seconds on the learner, none if not given)."""
    actors_by_round = list(actors_by_round)
    evaluation_s = [0.0] * len(actors_by_round) if evaluation_s is None else list(evaluation_s)
    if len(evaluation_s) != len(actors_by_round):
        raise ConfigError(f"reference_job: {len(evaluation_s)} evaluation times for {len(actors_by_round)} rounds")
    total, warm, out = 0.0, 0, []
    for actors, ev in zip(actors_by_round, evaluation_s):
        total += reference_round(actors, steps_per_actor, warm, rates, prices, actor_memory_mb,
                                 asynchronous=asynchronous, evaluation_s=ev)[1]
        warm = max(warm, int(actors))
        out.append(total)
    return out


def reference_evaluation_seconds(rounds, rates: ReferenceRates, steps_per_actor: int) -> list[float]:
    """Each round's evaluation at reference speed: what it measured, times the run's median ratio of the
    learner's reference time to its measured time (ingest + update) in the same rounds. Evaluation and update
    run in the same learner process, so the machine's load slows both alike; reports hold no count of the
    evaluation's env steps to price it per step. Synchronous reports measure evaluation on the cloud clock;
    asynchronous ones (IMPACT, whose cloud clock folds it into the next update) on this machine's wall clock,
    which the ratio then takes to the same reference."""
    rounds = list(rounds)
    ratios, measured = [], []
    for r in rounds:
        cloud, wall = r.get("cloud_phases") or {}, r.get("phases") or {}
        ph = cloud if cloud.get("evaluate", 0.0) > 0 or not wall.get("evaluate", 0.0) else wall
        measured.append(float(ph.get("evaluate", 0.0)) if r.get("evaluated") else 0.0)
        learner = float(ph.get("ingest", 0.0)) + float(ph.get("update", 0.0))
        samples = float(r.get("env_steps") or delivered_actors(r) * steps_per_actor)
        if learner > 0 and samples > 0 and not r.get("evaluated"):
            ratios.append(rates.learner_s_per_sample * samples / learner)
    scale = float(np.median(ratios)) if ratios else 1.0
    return [m * scale for m in measured]


@dataclass(frozen=True)
class Pricing:
    """How a comparison at equal dollars prices work (docs/cost.md, "Pricings"): the unit prices, the actors'
    memory size (its CPU share), the priced learner's speed against the one that measured the reference rates
    (`learner_speedup` divides its seconds per sample; `round_overhead_factor` multiplies its seconds per
    round), and whether evaluation is billed as learner time. A pricing file is its JSON."""

    name: str
    prices: Prices = Prices()
    actor_memory_mb: float = float(DEFAULT_ACTOR_MEMORY_MB)
    learner_speedup: float = 1.0
    round_overhead_factor: float = 1.0
    bill_evaluation: bool = True
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("invalid value for pricing.name: must be a non-empty string")
        for f in ("actor_memory_mb", "learner_speedup", "round_overhead_factor"):
            if not _check(f"pricing.{f}", getattr(self, f)) > 0:
                raise ConfigError(f"invalid value for pricing.{f}: must be > 0, got {getattr(self, f)!r}")
        if not isinstance(self.bill_evaluation, bool):
            raise ConfigError(f"invalid value for pricing.bill_evaluation: must be true or false, "
                              f"got {self.bill_evaluation!r}")

    @classmethod
    def from_mapping(cls, d: Mapping) -> "Pricing":
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown pricing setting(s) {unknown}; allowed: {sorted(names)}")
        return cls(**{**d, "prices": Prices.from_mapping(d.get("prices"))})

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "prices": self.prices.to_dict()}

    def rates(self, measured: ReferenceRates) -> ReferenceRates:
        """The reference rates of the priced learner, from those measured."""
        return dataclasses.replace(measured, learner_s_per_sample=measured.learner_s_per_sample / self.learner_speedup,
                                   learner_s_per_round=measured.learner_s_per_round * self.round_overhead_factor)


def delivered_actors(report: Mapping) -> int:
    """The actors a round report's launch ran: launched less failed. Every failed actor in the protocol's grids
    was throttled by the local endpoint's concurrency limit (a resumed twin job beside the run), which AWS does
    not bill and which I_max never reaches there."""
    return max(0, int(report.get("actors_launched") or 0) - int(report.get("actors_failed") or 0))


def exact_actor_bill(report: Mapping) -> bool:
    """Whether the report carries its own launches' Lambda bill (`cloud_actor_cost_usd`, since 2026-11-26)."""
    return float(report.get("cloud_actor_cost_usd") or 0.0) > 0.0


def round_actor_billed_seconds(report: Mapping, prices: Prices, actor_memory_mb: float) -> float:
    """The actor invocations' modelled billed seconds in one round report, from the Lambda bill of its own
    launches less the request fees, over the GB-second rate. Reports from before `cloud_actor_cost_usd` read
    it back from the round's cloud bill less the learner server's share (the ledger's growth between two
    reports, which can include invocations of the next round)."""
    fees = delivered_actors(report) * prices.lambda_usd_per_million_requests / 1e6
    if exact_actor_bill(report):
        lambda_usd = float(report["cloud_actor_cost_usd"]) - fees
    else:
        learner_usd = learner_cost(float(report.get("cloud_round_seconds") or 0.0), prices)
        lambda_usd = float(report.get("cloud_round_cost_usd") or 0.0) - learner_usd - fees
    return max(0.0, lambda_usd) / (prices.lambda_usd_per_gb_second * _check("memory_mb", actor_memory_mb) / MB_PER_GB)


def calibrate_reference_rates(rounds, steps_per_actor: int, prices: Prices,
                              quantile: float = REFERENCE_QUANTILE, *, asynchronous: bool = False,
                              actor_memory_mb: float) -> ReferenceRates:
    """Reference rates from round reports that carry `cloud_phases` (any number of runs of one env and
    preset), billed at `prices` with actors of `actor_memory_mb` (reports before 2026-12-02: PAPER_PRICES and
    LEGACY_ACTOR_MEMORY_MB): per unit of work, the `quantile` of what the rounds measured, so rounds slowed by
    other load on the machine do not set the price. The actor rate is per full vCPU (the reports' CPU share
    taken out). Actor speed comes from warm launches only (no cold start) without
    failed actors. Synchronous rounds (PPO) give it as the sample phase (the round waited for its actors);
    `asynchronous` rounds (IMPACT, whose update overlaps sampling and which report no sample phase) give it
    as the actors' billed seconds per step they were launched for (`round_actor_billed_seconds`). Without the
    report's own `cloud_actor_cost_usd` that bill is the ledger's growth between two reports, so an evaluated
    round also bills the next round's actors that finished during its evaluation, and the round after it
    misses them: both are then left out of the actor rate. Their learner rate skips rounds that follow an
    evaluation too (IMPACT counts the previous round's evaluation in `update`)."""
    step, sample, fixed = [], [], []
    warm, after_eval = {}, {}
    slow = lambda_cpu_slowdown(actor_memory_mb, prices)
    for r in rounds:
        ph, actors = r.get("cloud_phases") or {}, delivered_actors(r)
        job = r.get("job_id")
        if not ph or actors <= 0:
            continue
        samples = float(r.get("env_steps") or actors * steps_per_actor)
        clean_warm = actors <= warm.get(job, 0) and not r.get("actors_failed") and steps_per_actor > 0
        if asynchronous:
            if clean_warm and (exact_actor_bill(r) or not (r.get("evaluated") or after_eval.get(job))):
                step.append(round_actor_billed_seconds(r, prices, actor_memory_mb) / (actors * steps_per_actor * slow))
        # A synchronous round whose sample phase is 0 did not wait for its actors (an asynchronous learner):
        # it says nothing about actor speed.
        elif clean_warm and ph.get("sample", 0.0) > 0:
            step.append(max(0.0, ph.get("sample", 0.0) - prices.lambda_invoke_overhead_s) / (steps_per_actor * slow))
        warm[job] = max(warm.get(job, 0), actors)
        if samples > 0 and not (asynchronous and after_eval.get(job)):
            sample.append((ph.get("ingest", 0.0) + ph.get("update", 0.0)) / samples)
        after_eval[job] = bool(r.get("evaluated"))
        if not r.get("evaluated"):  # an evaluation overlaps the detector, which then looks free
            fixed.append(ph.get("publish", 0.0) + ph.get("detect", 0.0))
    if not step and sample and fixed and not asynchronous:
        raise ConfigError("calibrate_reference_rates: no round measured its actors' sampling (sample phase 0 in "
                          "every round: an asynchronous learner such as IMPACT overlaps it with the update), so "
                          "these runs cannot set an actor rate synchronously; calibrate them with "
                          "asynchronous=True (protocol-equal-cost does so for IMPACT grids)")
    if not step or not sample or not fixed:
        raise ConfigError("calibrate_reference_rates: no round report with cloud_phases after a warm launch "
                          "(needs runs of at least two rounds with the cloud clock)")
    q = float(quantile)
    return ReferenceRates(actor_s_per_step=float(np.quantile(step, q)),
                          learner_s_per_sample=float(np.quantile(sample, q)),
                          learner_s_per_round=float(np.quantile(fixed, q)))


def phase_bill(rounds, billed_prices: Prices, billed_memory_mb: float, prices: Prices,
               memory_mb: float) -> dict[str, float]:
    """A job's cloud bill phase by phase (USD), from its round reports billed at `billed_prices` with actors of
    `billed_memory_mb`, re-priced at `prices` with actors of `memory_mb`: each learner phase at the learner's
    price, the actors' Lambda bill as "actors". Actor time is taken as CPU-bound, so it moves with the ratio of
    the two sizes' CPU slowdowns, and so does the sample phase beyond the invoke overhead (the round waits for
    its slowest actor)."""
    ratio = lambda_cpu_slowdown(memory_mb, prices) / lambda_cpu_slowdown(billed_memory_mb, billed_prices)
    out: dict[str, float] = {}
    for r in rounds:
        for phase, seconds in (r.get("cloud_phases") or {}).items():
            if phase == "sample":
                overhead = min(float(seconds), prices.lambda_invoke_overhead_s)
                seconds = overhead + (float(seconds) - overhead) * ratio
            out[phase] = out.get(phase, 0.0) + learner_cost(float(seconds), prices)
        actors = delivered_actors(r)
        if actors:
            billed_s = round_actor_billed_seconds(r, billed_prices, billed_memory_mb) * ratio
            out["actors"] = out.get("actors", 0.0) + lambda_cost(billed_s * 1000.0, actors, memory_mb, prices)
    out["total"] = sum(out.values())
    return out
