"""The training spec: defaults, validation and every conversion between it and the gRPC messages.

The server validates every StartTraining request with `validate`; the SDK and
CLI use the same code so a bad flag fails before anything is sent. Errors are
`InvalidSpec` naming the field and what is allowed (INVALID_ARGUMENT on the wire).
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nitro.config import BOUND_SCHEDULES, STALENESS_WEIGHTS
from nitro.contracts import (
    DEFAULT_ACTOR_MEMORY_MB,
    DEFAULT_ENVS_PER_ACTOR,
    DEFAULT_EVALUATION,
    DEFAULT_I_MAX,
    DEFAULT_I_MIN,
    DEFAULT_SCALING_POLICY,
    EVALUATIONS,
    FIXED_ACTORS_BY_ALGO,
    FLOOR_ACTORS,
    FLOOR_DECAY,
    GROW_FRACTIONS,
    HYDROZOA_PERIOD,
    JOB_ID_RULE,
    MAX_ENVS_PER_ACTOR,
    NOISE_KAPPA,
    SCALING_POLICIES,
    SCORE_DECAY,
    SCORE_WINDOW,
    default_fixed_actors,
    is_job_id,
)
from nitro.cost import CLOCKS
from nitro.errors import ConfigError, UnknownEnvironmentError
from nitro.scaling.policies import split_policy

ALGOS = ("ppo", "impact")
ASYNCHRONOUS_ALGOS = ("impact",)  # the learner trains while the actors sample (off-policy loop, V-trace)
# Algorithms whose learner reads the values V(obs_t) actors record at every step (PPO's GAE and value clipping).
# IMPACT's V-trace takes its values from the learner's own critic (vtrace_critic "online"; "target": the target
# network's), so its actors skip the per-step critic and record only the bootstrap values (truncations' final
# observations, the batch's next observation), shipping those observations too: 2-18% more steps per billed
# second (docs/algorithms.md, IMPACT).
BEHAVIOUR_VALUE_ALGOS = ("ppo",)
DETECTOR_FALLBACKS = ("i_min", "last")
LEARNER_MODES = ("central", "stellaris")
MAX_ACTORS = 1000
MAX_ROUNDS = 100_000
MAX_STEPS_PER_ACTOR = 1_000_000
MAX_BUDGET_USD = 1_000_000.0
MAX_STALENESS_BOUND = 10_000
MAX_HIDDEN_LAYERS = 8
MAX_HIDDEN_WIDTH = 1024  # 8 layers of 1024: ~15M weights for actor and critic together


class InvalidSpec(ConfigError):
    def __init__(self, field_name: str, message: str):
        self.field = field_name
        self.detail = message
        super().__init__(f"{field_name}: {message}")


def parse_policy(text: str, field_name: str = "scaler.policy") -> tuple[str, int | None]:
    """nitro.scaling.policies.split_policy, the one parser of "fixed:N", as the CLI's --scaler, spec files and the
    wire read it: InvalidSpec naming `field_name` instead of its ConfigError (names are checked by validate)."""
    try:
        return split_policy(text)
    except ConfigError as exc:
        raise InvalidSpec(field_name, str(exc)) from None


@dataclass
class ScalerSettings:
    policy: str = DEFAULT_SCALING_POLICY
    i_min: int = DEFAULT_I_MIN
    i_max: int = DEFAULT_I_MAX
    fixed_actors: int = 0  # 0: the algorithm's count (nitro.contracts.default_fixed_actors), filled in by validate
    decay: float = SCORE_DECAY
    window: int = SCORE_WINDOW
    period: int = HYDROZOA_PERIOD
    scheduler: str = ""  # "minions": path of a pre-trained scheduler checkpoint
    actors_by_round: str = ""  # "replay": comma-separated actor counts per round, e.g. "8,16,12"
    floor_actors: int = FLOOR_ACTORS  # "nitro-floor": F of the floor round(F * floor_decay^(k^2))
    floor_decay: float = FLOOR_DECAY  # "nitro-floor": d_f of that floor
    kappa: float = NOISE_KAPPA  # "noise", "noise-adascale": kappa of kappa * sqrt(B_simple * a / c)
    grow_f1: float = GROW_FRACTIONS[0]  # "grow": the job's progress at which I_min doubles
    grow_f2: float = GROW_FRACTIONS[1]  # "grow": ... and doubles again

    def fixed_count(self, algo: str) -> int:
        """Actors per round of "fixed": the count given, else the algorithm's (nitro.contracts.default_fixed_actors).
        The one place the per-algorithm default is applied: validate fills the spec with it, and the scaler
        reads a ScalerSpec without a count by it."""
        return self.fixed_actors or default_fixed_actors(algo)


@dataclass
class StellarisSettings:
    """learner_mode "stellaris" (docs/stellaris.md; the algorithm is nitro.algos.stellaris)."""

    learner_function: str = "nitro-learner"
    learner_memory_mb: int = 2048
    max_learners: int = 16  # learner functions in flight; further batches wait for a free slot
    staleness_weight: str = "inverse"  # w(s): inverse (1+s)^-decay, exp exp(-decay s), none
    staleness_decay: float = 1.0
    bound_start: int = 16  # staleness bound of the first round ...
    bound_end: int = 4  # ... tightening to this one at the last round
    bound_schedule: str = "linear"  # linear, geometric or constant
    rho_bar: float = 2.0  # cap of the global importance-sampling truncation
    recent_versions: int = 1  # newest versions after a learner's base whose ratios truncate (0: local only)


@dataclass
class TrainingSpec:
    env_id: str = ""
    algo: str = "ppo"
    preset: str = "tuned"
    hyperparameters: dict[str, float] = field(default_factory=dict)
    scaler: ScalerSettings = field(default_factory=ScalerSettings)
    rounds: int = 50
    steps_per_actor: int = 256
    budget_usd: float = 10.0
    seed: int = 0
    eval_episodes: int = 5
    round_deadline_s: float = 120.0
    job_id: str = ""
    actor_memory_mb: int = DEFAULT_ACTOR_MEMORY_MB  # one full vCPU on Lambda (nitro.contracts)
    function_name: str = "nitro-actor"
    target_return: float = 0.0
    min_sample_fraction: float = 0.5
    detector_fallback: str = "i_min"
    detector_timeout_s: float = 30.0
    learner_mode: str = "central"
    stellaris: StellarisSettings = field(default_factory=StellarisSettings)
    # Every actor invocation starts fresh episodes from its own seed instead of continuing the
    # warm environment's episode, so the same seed gives the same run (docs/algorithms.md).
    reproducible: bool = False
    # The bill the budget binds on: "cloud" (the modelled AWS bill, docs/cost.md) or "machine".
    budget_clock: str = "cloud"
    eval_every: int = 1  # evaluate after every eval_every-th round and after the last one
    # The policy's MLP: hidden layer widths and activation; empty means the algorithm preset's.
    hidden_sizes: list[int] = field(default_factory=list)
    activation: str = ""
    # Keyword arguments of every environment the job builds (learner and actors), see nitro.policy.env_kwargs.
    env_kwargs: dict = field(default_factory=dict)
    # Environments each actor steps in lockstep with one batched inference per step; steps_per_actor
    # stays the total an actor returns. An actor runs min(envs_per_actor, max(1, steps_per_actor // 32))
    # envs, so every env's trajectory segment has at least 32 steps (docs/algorithms.md).
    envs_per_actor: int = DEFAULT_ENVS_PER_ACTOR
    # IMPACT (learner_mode "central"): whose critic V-trace reads, "online" (the learner's, recomputed before every
    # minibatch step) or "target" (the target network's, with the actors' bootstrap values); empty: the preset's
    # ("online"). nitro.config.IMPACTConfig.vtrace_critic, docs/algorithms.md.
    vtrace_critic: str = ""
    # Where evaluation episodes run: "functions" (serverless evaluation functions on the version just published,
    # in parallel with the next round: off the learner's critical path and bill) or "learner" (on the learner,
    # between rounds). docs/evaluation.md.
    evaluation: str = DEFAULT_EVALUATION

    def __post_init__(self) -> None:
        if isinstance(self.stellaris, dict):  # from a saved job.json or checkpoint
            self.stellaris = StellarisSettings(**self.stellaris)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _finite(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidSpec(name, f"must be a finite number, got {value!r}")


def refusal(exc: ConfigError) -> tuple[str, str]:
    """(gRPC status name, detail) StartTraining answers a spec that fails `validate` with: a well-formed
    scheduler checkpoint trained for another job shape is FAILED_PRECONDITION, every other error
    INVALID_ARGUMENT. The learner and `nitro train --local` (which checks before it starts a system) share it."""
    from nitro.scaling.minions import SchedulerMismatchError

    if isinstance(exc, SchedulerMismatchError):
        return "FAILED_PRECONDITION", str(exc)  # the message names the field already
    return "INVALID_ARGUMENT", str(exc)


def validate(spec: TrainingSpec) -> TrainingSpec:
    """Check every field; returns the spec (with a generated job id if none was given).

    A `preset` naming an environment preset (nitro.presets, e.g. "qbert-impact") is
    expanded first by `apply_env_preset`; fields that differ from their defaults win.
    """
    from nitro.config import ALGO_PRESETS, make_config
    from nitro.policy.envs import resolve_env_id

    apply_env_preset(spec)
    if spec.reproducible and (spec.algo != "ppo" or spec.learner_mode != "central"):
        raise InvalidSpec("reproducible", "is allowed only with algo 'ppo' and learner_mode 'central': the "
                                          "asynchronous loops train on batches in the order they arrive")
    if spec.reproducible and spec.scaler.policy == "minions":
        raise InvalidSpec("reproducible", "is not allowed with scaler 'minions': its decisions read measured "
                                          "round times")
    if not spec.env_id:
        raise InvalidSpec("env_id", "is required, e.g. 'Hopper-v5' or 'CartPole-v1'")
    try:
        resolve_env_id(spec.env_id)
    except UnknownEnvironmentError as exc:
        raise InvalidSpec("env_id", f"{exc}; allowed: any registered Gymnasium id (e.g. 'CartPole-v1', "
                          "'Hopper-v5', 'ALE/Qbert-v5') or 'package.module:EnvId-v0'") from exc
    if spec.algo not in ALGOS:
        raise InvalidSpec("algo", f"unknown algorithm {spec.algo!r}; allowed: {list(ALGOS)}")
    if spec.preset not in ALGO_PRESETS[spec.algo]:
        from nitro.presets import env_preset_names

        raise InvalidSpec("preset", f"unknown preset {spec.preset!r} for {spec.algo}; allowed: "
                          f"{sorted(ALGO_PRESETS[spec.algo])} or an environment preset {env_preset_names()}")
    for name, value in spec.hyperparameters.items():
        _finite(f"hyperparameters.{name}", value)
    _validate_model(spec)
    try:
        make_config(spec.algo, spec.preset, **_typed_overrides(spec.hyperparameters, spec.algo))
    except InvalidSpec:
        raise
    except ConfigError as exc:
        raise InvalidSpec("hyperparameters", str(exc)) from exc

    sc = spec.scaler
    if sc.policy not in SCALING_POLICIES:
        raise InvalidSpec("scaler.policy", f"unknown scaling policy {sc.policy!r}; allowed: {list(SCALING_POLICIES)}")
    if not 1 <= sc.i_min <= MAX_ACTORS:
        raise InvalidSpec("scaler.i_min", f"must be in [1, {MAX_ACTORS}], got {sc.i_min}")
    if not 1 <= sc.i_max <= MAX_ACTORS:
        raise InvalidSpec("scaler.i_max", f"must be in [1, {MAX_ACTORS}], got {sc.i_max}")
    if sc.i_min > sc.i_max:
        raise InvalidSpec("scaler.i_min", f"must be <= scaler.i_max ({sc.i_max}), got {sc.i_min}")
    sc.fixed_actors = sc.fixed_count(spec.algo)
    if not 1 <= sc.fixed_actors <= MAX_ACTORS:
        raise InvalidSpec("scaler.fixed_actors", f"must be in [1, {MAX_ACTORS}] (0: the algorithm's default, "
                          f"{FIXED_ACTORS_BY_ALGO}), got {sc.fixed_actors}")
    _finite("scaler.decay", sc.decay)
    if not 0.0 < sc.decay <= 1.0:
        raise InvalidSpec("scaler.decay", f"must be in (0, 1], got {sc.decay}")
    if not 1 <= sc.window <= 1000:
        raise InvalidSpec("scaler.window", f"must be in [1, 1000], got {sc.window}")
    if not 1 <= sc.period <= MAX_ROUNDS:
        raise InvalidSpec("scaler.period", f"must be in [1, {MAX_ROUNDS}], got {sc.period}")
    _validate_scheduler(sc)
    _validate_controls(sc)

    if not 1 <= spec.rounds <= MAX_ROUNDS:
        raise InvalidSpec("rounds", f"must be in [1, {MAX_ROUNDS}], got {spec.rounds}")
    if not 1 <= spec.steps_per_actor <= MAX_STEPS_PER_ACTOR:
        raise InvalidSpec("steps_per_actor", f"must be in [1, {MAX_STEPS_PER_ACTOR}], got {spec.steps_per_actor}")
    if isinstance(spec.envs_per_actor, bool) or not isinstance(spec.envs_per_actor, int) \
            or not 1 <= spec.envs_per_actor <= MAX_ENVS_PER_ACTOR:
        raise InvalidSpec("envs_per_actor", f"must be an integer in [1, {MAX_ENVS_PER_ACTOR}], got {spec.envs_per_actor!r}")
    _finite("budget_usd", spec.budget_usd)
    if not 0 < spec.budget_usd <= MAX_BUDGET_USD:
        raise InvalidSpec("budget_usd", f"must be in (0, {MAX_BUDGET_USD:g}], got {spec.budget_usd}")
    if not 0 <= spec.seed < 2**63:
        raise InvalidSpec("seed", f"must be in [0, 2^63), got {spec.seed}")
    if not 0 <= spec.eval_episodes <= 1000:
        raise InvalidSpec("eval_episodes", f"must be in [0, 1000], got {spec.eval_episodes}")
    if not 1 <= spec.eval_every <= MAX_ROUNDS:
        raise InvalidSpec("eval_every", f"must be in [1, {MAX_ROUNDS}], got {spec.eval_every}")
    if spec.evaluation not in EVALUATIONS:
        raise InvalidSpec("evaluation", f"unknown {spec.evaluation!r}; allowed: {list(EVALUATIONS)}")
    if spec.budget_clock not in CLOCKS:
        raise InvalidSpec("budget_clock", f"unknown {spec.budget_clock!r}; allowed: {list(CLOCKS)}")
    _finite("round_deadline_s", spec.round_deadline_s)
    if not 0 < spec.round_deadline_s <= 3600:
        raise InvalidSpec("round_deadline_s", f"must be in (0, 3600], got {spec.round_deadline_s}")
    if not 128 <= spec.actor_memory_mb <= 10240:
        raise InvalidSpec("actor_memory_mb", f"must be in [128, 10240] (AWS Lambda limits), got {spec.actor_memory_mb}")
    if not re.fullmatch(r"[A-Za-z0-9_:.-]{1,140}", spec.function_name or ""):
        raise InvalidSpec("function_name", "must be 1-140 characters of letters, digits, '-', '_', ':' or '.'")
    _finite("target_return", spec.target_return)
    _finite("min_sample_fraction", spec.min_sample_fraction)
    if not 0.0 < spec.min_sample_fraction <= 1.0:
        raise InvalidSpec("min_sample_fraction", f"must be in (0, 1], got {spec.min_sample_fraction}")
    if spec.detector_fallback not in DETECTOR_FALLBACKS:
        raise InvalidSpec("detector_fallback", f"unknown {spec.detector_fallback!r}; allowed: {list(DETECTOR_FALLBACKS)}")
    _finite("detector_timeout_s", spec.detector_timeout_s)
    if not 0 < spec.detector_timeout_s <= 600:
        raise InvalidSpec("detector_timeout_s", f"must be in (0, 600], got {spec.detector_timeout_s}")
    _validate_stellaris(spec)
    _validate_vtrace_critic(spec)
    if spec.job_id and not is_job_id(spec.job_id):
        raise InvalidSpec("job_id", f"must be {JOB_ID_RULE}")
    _validate_env_kwargs(spec)  # last: it may build the environment
    if not spec.job_id:
        spec.job_id = new_job_id(spec.env_id)
    return spec


def _validate_model(spec: TrainingSpec) -> None:
    """hidden_sizes and activation: the MLP of the policy (the Atari CNN's layers are fixed)."""
    from nitro.config import ACTIVATIONS
    from nitro.policy.envs import is_atari

    hs = spec.hidden_sizes
    if not isinstance(hs, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hs):
        raise InvalidSpec("hidden_sizes", f"must be a list of layer widths (integers), got {hs!r}")
    if len(hs) > MAX_HIDDEN_LAYERS or not all(1 <= h <= MAX_HIDDEN_WIDTH for h in hs):
        raise InvalidSpec("hidden_sizes", f"must be 1 to {MAX_HIDDEN_LAYERS} widths in [1, {MAX_HIDDEN_WIDTH}] "
                                          f"(empty: the preset's), got {list(hs)}")
    if spec.activation not in ("", *sorted(ACTIVATIONS)):
        raise InvalidSpec("activation", f"unknown {spec.activation!r}; allowed: {sorted(ACTIVATIONS)} (empty: the "
                                        "preset's)")
    if (hs or spec.activation) and is_atari(spec.env_id):
        name = "hidden_sizes" if hs else "activation"
        raise InvalidSpec(name, f"applies to MLP policies; {spec.env_id} uses the fixed Atari CNN (leave it empty)")


def _validate_env_kwargs(spec: TrainingSpec) -> None:
    """Structure first (nitro.policy.env_kwargs), then build the environment once: a keyword it does not
    take fails here, as INVALID_ARGUMENT, rather than in every actor."""
    from nitro.policy import env_kwargs
    from nitro.policy.envs import make_env

    try:
        spec.env_kwargs = env_kwargs.check(spec.env_kwargs)
    except env_kwargs.EnvKwargsError as exc:
        raise InvalidSpec("env_kwargs", exc.detail) from None
    if not spec.env_kwargs:
        return
    try:
        env = make_env(spec.env_id, **spec.env_kwargs)
        try:  # some arguments are only read at reset (an ALE env's obs_type="ram" fails the preprocessing there)
            env.reset(seed=0)
        finally:
            env.close()
    except Exception as exc:  # whatever the environment's constructor or reset raises for arguments it rejects
        raise InvalidSpec("env_kwargs", f"{spec.env_id} does not accept {spec.env_kwargs}: "
                          f"{type(exc).__name__}: {exc}"[:1000]) from None


def _validate_stellaris(spec: TrainingSpec) -> None:
    """The learner mode and its settings (checked in every mode, so a typo never waits for a switch)."""
    if spec.learner_mode not in LEARNER_MODES:
        raise InvalidSpec("learner_mode", f"unknown {spec.learner_mode!r}; allowed: {list(LEARNER_MODES)}")
    st = spec.stellaris
    if not re.fullmatch(r"[A-Za-z0-9_:.-]{1,140}", st.learner_function or ""):
        raise InvalidSpec("stellaris.learner_function", "must be 1-140 characters of letters, digits, '-', '_', ':' "
                          "or '.'")
    if not 128 <= st.learner_memory_mb <= 10240:
        raise InvalidSpec("stellaris.learner_memory_mb",
                          f"must be in [128, 10240] (AWS Lambda limits), got {st.learner_memory_mb}")
    if not 1 <= st.max_learners <= MAX_ACTORS:
        raise InvalidSpec("stellaris.max_learners", f"must be in [1, {MAX_ACTORS}], got {st.max_learners}")
    if st.staleness_weight not in STALENESS_WEIGHTS:
        raise InvalidSpec("stellaris.staleness_weight",
                          f"unknown {st.staleness_weight!r}; allowed: {list(STALENESS_WEIGHTS)}")
    _finite("stellaris.staleness_decay", st.staleness_decay)
    if not 0.0 <= st.staleness_decay <= 100.0:
        raise InvalidSpec("stellaris.staleness_decay", f"must be in [0, 100], got {st.staleness_decay}")
    for name in ("bound_start", "bound_end"):
        if not 0 <= getattr(st, name) <= MAX_STALENESS_BOUND:
            raise InvalidSpec(f"stellaris.{name}", f"must be in [0, {MAX_STALENESS_BOUND}], got {getattr(st, name)}")
    if st.bound_end > st.bound_start:
        raise InvalidSpec("stellaris.bound_end", f"must be <= stellaris.bound_start ({st.bound_start}): the bound "
                          f"tightens over the rounds, got {st.bound_end}")
    if st.bound_schedule not in BOUND_SCHEDULES:
        raise InvalidSpec("stellaris.bound_schedule", f"unknown {st.bound_schedule!r}; allowed: {list(BOUND_SCHEDULES)}")
    _finite("stellaris.rho_bar", st.rho_bar)
    if not 1.0 <= st.rho_bar <= 1000.0:
        raise InvalidSpec("stellaris.rho_bar", f"must be in [1, 1000] (fresh samples keep weight 1), got {st.rho_bar}")
    if not 0 <= st.recent_versions <= 16:
        raise InvalidSpec("stellaris.recent_versions", f"must be in [0, 16], got {st.recent_versions}")


def _validate_scheduler(sc: ScalerSettings) -> None:
    """Policy "minions" needs a checkpoint that exists, loads and fits this job's I_max. This runs in the
    learner; the scaler reads the same path, so in a cloud deployment it must be readable by both. A
    missing or corrupt file raises InvalidSpec (INVALID_ARGUMENT); a valid checkpoint made for another
    I_max, format version or layout raises SchedulerMismatchError (FAILED_PRECONDITION)."""
    if sc.policy != "minions":
        if sc.scheduler:
            raise InvalidSpec("scaler.scheduler", f"is only used with scaler.policy 'minions', got policy "
                              f"{sc.policy!r}")
        return
    from nitro.scaling.minions import SchedulerCheckpointError, SchedulerMismatchError, load_scheduler_cached

    try:
        load_scheduler_cached(sc.scheduler).check_i_max(sc.i_max)
    except SchedulerMismatchError:
        raise
    except SchedulerCheckpointError as exc:
        raise InvalidSpec("scaler.scheduler", exc.detail) from None


def _validate_controls(sc: ScalerSettings) -> None:
    """The evaluation controls' settings: "replay"'s actor list, "nitro-floor"'s floor (docs/scaling.md)."""
    from nitro.scaling.policies import parse_actor_counts

    if not 1 <= sc.floor_actors <= MAX_ACTORS:
        raise InvalidSpec("scaler.floor_actors", f"must be in [1, {MAX_ACTORS}], got {sc.floor_actors}")
    _finite("scaler.floor_decay", sc.floor_decay)
    if not 0.0 < sc.floor_decay <= 1.0:
        raise InvalidSpec("scaler.floor_decay", f"must be in (0, 1], got {sc.floor_decay}")
    _finite("scaler.kappa", sc.kappa)
    if not 0.0 < sc.kappa <= 1e6:
        raise InvalidSpec("scaler.kappa", f"must be in (0, 1e6], got {sc.kappa}")
    for name in ("grow_f1", "grow_f2"):
        _finite(f"scaler.{name}", getattr(sc, name))
        if not 0.0 <= getattr(sc, name) <= 1.0:
            raise InvalidSpec(f"scaler.{name}", f"must be in [0, 1] (a fraction of the job), got {getattr(sc, name)}")
    if sc.grow_f2 < sc.grow_f1:
        raise InvalidSpec("scaler.grow_f2", f"must be >= scaler.grow_f1 ({sc.grow_f1:g}), got {sc.grow_f2:g}")
    if sc.policy not in ("replay", "noise-replay"):
        if sc.actors_by_round:
            raise InvalidSpec("scaler.actors_by_round", f"is only used with scaler.policy 'replay' or "
                              f"'noise-replay', got policy {sc.policy!r}")
        return
    if not isinstance(sc.actors_by_round, str):
        raise InvalidSpec("scaler.actors_by_round", "must be comma-separated actor counts, e.g. '8,16,12', got "
                          f"{sc.actors_by_round!r}")
    try:
        counts = parse_actor_counts(sc.actors_by_round, "scaler.actors_by_round")
    except ConfigError as exc:
        raise InvalidSpec("scaler.actors_by_round", str(exc).removeprefix(
            "invalid value for scaler.actors_by_round: ")) from None
    if max(counts) > MAX_ACTORS:
        raise InvalidSpec("scaler.actors_by_round", f"counts must be in [1, {MAX_ACTORS}], got {max(counts)}")


def _validate_vtrace_critic(spec: TrainingSpec) -> None:
    """vtrace_critic: empty, or one of nitro.config.VTRACE_CRITICS for the learner that reads it."""
    from nitro.config import VTRACE_CRITICS

    if spec.vtrace_critic == "":
        return
    if spec.vtrace_critic not in VTRACE_CRITICS:
        raise InvalidSpec("vtrace_critic", f"unknown {spec.vtrace_critic!r}; allowed: {list(VTRACE_CRITICS)} (empty: "
                                           f"the preset's, {VTRACE_CRITICS[0]!r})")
    if spec.algo != "impact" or spec.learner_mode != "central":
        raise InvalidSpec("vtrace_critic", f"is read only by algo 'impact' with learner_mode 'central', got algo "
                                           f"{spec.algo!r} and learner_mode {spec.learner_mode!r}; leave it empty")


def new_job_id(env_id: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9]+", "-", env_id.split(":")[-1].split("/")[-1]).strip("-").lower()[:24] or "job"
    return f"{stem}-{uuid.uuid4().hex[:8]}"


_NUMERIC_TYPES = ("int", "float", "bool", int, float, bool)
# Where the config fields the wire's numeric map cannot carry are set instead.
_NON_NUMERIC_HOME = {"hidden_sizes": "with the spec's hidden_sizes field, e.g. [64, 64]",
                     "activation": "with the spec's activation field ('tanh' or 'relu')",
                     "value_clip_mode": "by preset (or PPOConfig in Python)",
                     "vtrace_critic": "with the spec's vtrace_critic field ('online' or 'target')"}


def _typed_overrides(hp: dict[str, float], algo: str = "ppo") -> dict:
    """Numeric wire values -> the algorithm config's field types (ints stay ints, bools from 0/1)."""
    from nitro.config import CONFIG_CLASSES

    types = {f.name: f.type for f in dataclasses.fields(CONFIG_CLASSES.get(algo, CONFIG_CLASSES["ppo"]))}
    out = {}
    for k, v in hp.items():
        t = types.get(k)
        if t is not None and t not in _NUMERIC_TYPES:
            raise InvalidSpec(f"hyperparameters.{k}", f"is not numeric, so the hyperparameters map cannot carry "
                                                      f"it; set it {_NON_NUMERIC_HOME.get(k, 'by preset')}")
        if t in ("int", int):
            if float(v) != int(v):
                raise InvalidSpec(f"hyperparameters.{k}", f"must be an integer, got {v}")
            out[k] = int(v)
        elif t in ("bool", bool):
            out[k] = bool(v)
        else:
            out[k] = float(v)
    return out


def algo_config(spec: TrainingSpec):
    """The spec's hyperparameters: a PPOConfig or IMPACTConfig (by `spec.algo`) from its preset plus
    overrides, with the spec's hidden_sizes and activation when it sets them."""
    from nitro.config import make_config

    apply_env_preset(spec)
    model = {"hidden_sizes": tuple(spec.hidden_sizes)} if spec.hidden_sizes else {}
    if spec.activation:
        model["activation"] = spec.activation
    if spec.vtrace_critic and spec.algo == "impact":
        model["vtrace_critic"] = spec.vtrace_critic
    return make_config(spec.algo, spec.preset, **_typed_overrides(spec.hyperparameters, spec.algo), **model)


# Spec fields an environment preset fills in ("scaler.x" for scaler settings).
_PRESET_FIELDS = ("env_id", "algo", "steps_per_actor", "eval_episodes", "scaler.i_min", "scaler.i_max")


def _get(spec: TrainingSpec, name: str):
    return getattr(spec.scaler, name[7:]) if name.startswith("scaler.") else getattr(spec, name)


def apply_env_preset(spec: TrainingSpec, explicit: set[str] | None = None) -> TrainingSpec:
    """Expand `spec.preset` in place when it names an environment preset (nitro.presets); else no-op.

    The preset supplies env_id, algo, the algorithm preset (which replaces spec.preset),
    hyperparameter overrides (spec.hyperparameters win per key), steps_per_actor,
    eval_episodes and scaler.i_min/i_max. Fields named in `explicit` (or, when it is
    None, fields that differ from TrainingSpec's defaults) keep the spec's value; an
    explicit env_id or algo that contradicts the preset is an InvalidSpec.
    """
    from nitro.presets import is_env_preset, resolve_preset

    if not is_env_preset(spec.preset):
        return spec
    preset = resolve_preset(spec.preset)
    if explicit is None:
        defaults = TrainingSpec()
        explicit = {n for n in _PRESET_FIELDS if _get(spec, n) != _get(defaults, n)}
    values = {"env_id": preset.env_id, "algo": preset.algo, "steps_per_actor": preset.steps_per_actor,
              "eval_episodes": preset.eval_episodes, "scaler.i_min": preset.i_min, "scaler.i_max": preset.i_max}
    for name in ("env_id", "algo"):
        if name in explicit and _get(spec, name) != values[name]:
            raise InvalidSpec(name, f"{_get(spec, name)!r} contradicts preset {spec.preset!r}, which is for "
                              f"{name} {values[name]!r}; leave {name} unset or pick another preset")
    for name, value in values.items():
        if name in explicit:
            continue
        if name.startswith("scaler."):
            setattr(spec.scaler, name[7:], value)
        else:
            setattr(spec, name, value)
    spec.hyperparameters = {**preset.hyperparameters, **spec.hyperparameters}
    spec.preset = preset.algo_preset
    return spec


# -- wire conversion -----------------------------------------------------------------

_SCALAR_FIELDS = ("rounds", "steps_per_actor", "budget_usd", "seed", "eval_episodes", "round_deadline_s",
                  "actor_memory_mb", "target_return", "min_sample_fraction", "detector_timeout_s", "reproducible",
                  "eval_every", "envs_per_actor")
_SCALER_FIELDS = ("i_min", "i_max", "fixed_actors", "decay", "window", "period", "floor_actors", "floor_decay",
                  "kappa", "grow_f1", "grow_f2")
_STELLARIS_OPTIONAL = ("learner_memory_mb", "max_learners", "staleness_decay", "bound_start", "bound_end", "rho_bar",
                       "recent_versions")
_STELLARIS_STRINGS = ("learner_function", "staleness_weight", "bound_schedule")


def from_proto(msg) -> TrainingSpec:
    """Message -> spec; unset optional fields keep their defaults, set ones are taken as given."""
    spec = TrainingSpec(env_id=msg.env_id, job_id=msg.job_id)
    if msg.algo:
        spec.algo = msg.algo
    if msg.preset:
        spec.preset = msg.preset
    if msg.function_name:
        spec.function_name = msg.function_name
    if msg.detector_fallback:
        spec.detector_fallback = msg.detector_fallback
    if msg.learner_mode:
        spec.learner_mode = msg.learner_mode
    if msg.budget_clock:
        spec.budget_clock = msg.budget_clock
    if msg.evaluation:
        spec.evaluation = msg.evaluation
    spec.hidden_sizes = list(msg.hidden_sizes)
    spec.activation = msg.activation
    spec.vtrace_critic = msg.vtrace_critic
    spec.env_kwargs = env_kwargs_from_wire(msg.env_kwargs_json)
    if msg.HasField("stellaris"):
        for name in _STELLARIS_STRINGS:
            if getattr(msg.stellaris, name):
                setattr(spec.stellaris, name, getattr(msg.stellaris, name))
        for name in _STELLARIS_OPTIONAL:
            if msg.stellaris.HasField(name):
                setattr(spec.stellaris, name, getattr(msg.stellaris, name))
    spec.hyperparameters = dict(msg.hyperparameters)
    for name in _SCALAR_FIELDS:
        if msg.HasField(name):
            setattr(spec, name, getattr(msg, name))
    explicit = {n for n in ("env_id", "algo") if getattr(msg, n)}
    explicit |= {n for n in ("steps_per_actor", "eval_episodes") if msg.HasField(n)}
    if msg.HasField("scaler"):
        explicit |= {f"scaler.{n}" for n in ("i_min", "i_max") if msg.scaler.HasField(n)}
        spec.scaler = scaler_from_proto(msg.scaler)
    return apply_env_preset(spec, explicit)


def scaler_from_proto(msg) -> ScalerSettings:
    """The settings of a ScalerSpec message, the inverse of scaler_to_proto: unset fields keep ScalerSettings'
    defaults (nitro.contracts'), "fixed:16" is read by parse_policy, and fixed_actors stays 0 (the algorithm's
    count, ScalerSettings.fixed_count) unless given. The learner's from_proto and the scaler's policy_params both
    read a ScalerSpec here, so neither applies a default of its own."""
    sc = ScalerSettings()
    if msg.policy:
        sc.policy, count = parse_policy(msg.policy)
        if count is not None:  # "fixed:16" shorthand; a fixed_actors field, read below, wins
            sc.fixed_actors = count
    sc.scheduler = msg.scheduler
    sc.actors_by_round = msg.actors_by_round
    for name in _SCALER_FIELDS:
        if msg.HasField(name):
            setattr(sc, name, getattr(msg, name))
    return sc


def dict_to_proto(spec: Mapping[str, Any]):
    """A partial spec as a dict (the CLI's, a spec file's, the SDK's) -> the TrainingSpec message, setting only the
    fields it names so the server's defaults apply to the rest; InvalidSpec naming a bad or unknown field.

    Keys are TrainingSpec's field names; "scaler" is a dict of ScalerSpec fields or a policy string ("nitro",
    "fixed:16", ...); "stellaris" a dict of StellarisSpec fields; "hyperparameters" a dict of numeric overrides;
    "hidden_sizes" a list of layer widths; "env_kwargs" a dict of JSON values.
    """
    from nitro.presets import is_env_preset
    from nitro.v1 import training_pb2

    fields = {f.name for f in dataclasses.fields(TrainingSpec)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise InvalidSpec(unknown[0], f"unknown field; allowed: {sorted(fields)}")
    if (not isinstance(spec.get("env_id"), str) or not spec["env_id"]) and not is_env_preset(spec.get("preset", "")):
        raise InvalidSpec("env_id", "is required, e.g. 'Hopper-v5' or 'CartPole-v1' (or an environment preset "
                                    "such as 'hopper-ppo')")
    msg = training_pb2.TrainingSpec()
    for name, value in spec.items():
        if value is None:
            continue
        if name == "scaler":
            _set_nested(msg.scaler, {"policy": value} if isinstance(value, str) else value, "scaler",
                        "must be a policy name or a dict of scaler settings")
        elif name == "stellaris":
            _set_nested(msg.stellaris, value, "stellaris", "must be a dict of stellaris settings")
        elif name == "hyperparameters":
            if not isinstance(value, Mapping):
                raise InvalidSpec(name, f"must be a dict of numeric overrides, e.g. {{'lr': 3e-4}}, got {value!r}")
            for key, v in value.items():
                _set(msg.hyperparameters, key, v, f"hyperparameters.{key}")
        elif name == "hidden_sizes":
            if not isinstance(value, list | tuple) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                              for h in value):
                raise InvalidSpec("hidden_sizes", f"must be a list of layer widths, e.g. [64, 64], got {value!r}")
            _set(msg.hidden_sizes, None, value, "hidden_sizes")
        elif name == "env_kwargs":
            msg.env_kwargs_json = env_kwargs_to_wire(value)
        else:
            _set(msg, name, value, name)
    return msg


def _set_nested(msg, value: object, group: str, what: str) -> None:
    """Fill a nested message (ScalerSpec, StellarisSpec) from a dict or dataclass, naming bad fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise InvalidSpec(group, what)
    fields = set(msg.DESCRIPTOR.fields_by_name)
    unknown = sorted(set(value) - fields)
    if unknown:
        raise InvalidSpec(f"{group}.{unknown[0]}", f"unknown field; allowed: {sorted(fields)}")
    for name, v in value.items():
        if v is not None:
            _set(msg, name, v, f"{group}.{name}")
    msg.SetInParent()  # an empty dict still marks the field as given


def _set(target, name: str | None, value: object, label: str) -> None:
    """One field of a message (`name`), one entry of a map<string, double> (`name` a key), or a repeated field's
    values (`name` None); InvalidSpec naming `label` when protobuf refuses the value."""
    try:
        if name is None:
            target.extend(value)
        elif hasattr(target, "DESCRIPTOR"):
            setattr(target, name, value)
        else:
            target[name] = value
    except (TypeError, ValueError) as exc:
        raise InvalidSpec(label, f"bad value {value!r}: {exc}") from None


def env_kwargs_from_wire(text: str) -> dict:
    """TrainingSpec.env_kwargs_json -> dict; InvalidSpec naming env_kwargs when malformed."""
    from nitro.policy import env_kwargs

    try:
        return env_kwargs.from_json(text)
    except env_kwargs.EnvKwargsError as exc:
        raise InvalidSpec("env_kwargs", exc.detail) from None


def env_kwargs_to_wire(kwargs) -> str:
    """dict -> TrainingSpec.env_kwargs_json ("" for none); InvalidSpec naming env_kwargs when malformed."""
    from nitro.policy import env_kwargs

    try:
        return env_kwargs.to_json(kwargs)
    except env_kwargs.EnvKwargsError as exc:
        raise InvalidSpec("env_kwargs", exc.detail) from None


def scaler_to_proto(sc: ScalerSettings):
    """The ScalerSpec message of the settings: what a job's spec carries and what the learner sends the scaler
    with every Plan (one conversion for both)."""
    from nitro.v1 import common_pb2

    return common_pb2.ScalerSpec(policy=sc.policy, scheduler=sc.scheduler, actors_by_round=sc.actors_by_round,
                                 # fixed_actors 0 (the algorithm's count) stays unset: a learner older than the
                                 # per-algorithm default would refuse 0, and one with it reads unset as 0
                                 **{n: getattr(sc, n) for n in _SCALER_FIELDS if n != "fixed_actors" or sc.fixed_actors})


def to_proto(spec: TrainingSpec):
    from nitro.v1 import training_pb2

    st = spec.stellaris
    return training_pb2.TrainingSpec(
        env_id=spec.env_id, algo=spec.algo, preset=spec.preset, hyperparameters=spec.hyperparameters,
        scaler=scaler_to_proto(spec.scaler),
        job_id=spec.job_id, function_name=spec.function_name, detector_fallback=spec.detector_fallback,
        learner_mode=spec.learner_mode, budget_clock=spec.budget_clock, evaluation=spec.evaluation,
        hidden_sizes=spec.hidden_sizes, activation=spec.activation, vtrace_critic=spec.vtrace_critic,
        env_kwargs_json=env_kwargs_to_wire(spec.env_kwargs),
        stellaris=training_pb2.StellarisSpec(**{n: getattr(st, n) for n in _STELLARIS_STRINGS + _STELLARIS_OPTIONAL}),
        **{n: getattr(spec, n) for n in _SCALAR_FIELDS})
