"""The scaling policies (paper 5.3 and the baselines of 8.3 / 8.5) and make_policy().

nitro     I_k = clip(round(I_max * S_k), I_min, I_max)
fixed     N every round ("no boosting"; the paper's ablation uses 16); ignores I_min/I_max
max       I_max every round
hydrozoa  I_min * 2^floor(k / every), capped at I_max (every = 10 rounds, paper 8.3's example)
kungfu    round(I_min * B_noise / B_ref), B_ref = the first known noise scale (so the first
          round gives I_min), never below the previous round, clipped to [I_min, I_max]
minions   a pre-trained actor-critic scheduler (MinionsRL) picks 1..I_max from how the last round went,
          floored at I_min (nitro.scaling.minions; params: scheduler = the checkpoint's path)

Controls for the evaluation protocol (experiments/protocol.py, docs/scaling.md):

schedule     clip(round(I_max * d^k), I_min, I_max): nitro's decay without the detector (params: decay d)
replay       plays a given list of actor counts, round k gets actors_by_round[k] clipped to [I_min, I_max];
             rounds past the end of the list repeat its last count (params: actors_by_round, a sequence
             or a comma-separated string). The protocol's shuffled-score control replays nitro's scores
             permuted across rounds.
nitro-floor  nitro's decision floored at round(F * d_f^(k^2)), clipped to [I_min, I_max]: the front-loading
             floor of the authors' artifact, which the paper does not mention (params: floor_actors F = 64,
             floor_decay d_f = 0.96)

Built on the committed evidence (issue 40, docs/scaling.md "Growing rounds"):

grow            I_min until a fraction f1 of the job is done, 2 * I_min until f2, 4 * I_min after (never down);
                the job's progress is the larger of the budget fraction spent and the planned rounds done
                (params: f1 = 0.4, f2 = 0.8)
noise           the cost-aware critical batch: clip(pow2(kappa * sqrt(B_simple * a / c) / steps_per_actor),
                I_min, I_max), never down; B_simple of the policy gradient alone, its |G|^2 and tr(Sigma) each
                averaged across rounds (EMA) before dividing; a and c the per-round and per-sample cost from the
                job's ledger (params: kappa, ema = the newest estimate's weight)
noise-adascale  noise's counts; the learner then scales its update to the round (AdaScale, nitro.scaling.noise)
noise-replay    replay under its own name: the actor counts of a noise run of another seed (the control)

k is the index of the round being planned (0-based).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nitro.contracts import (
    FIXED_ACTORS,
    FLOOR_ACTORS,
    FLOOR_DECAY,
    GROW_FRACTIONS,
    HYDROZOA_PERIOD,
    NOISE_EMA,
    NOISE_KAPPA,
    SCALING_POLICIES,
    SCORE_DECAY,
)
from nitro.errors import ConfigError
from nitro.scaling.base import RoundInputs, ScalingPolicy, check_params, clip, round_half_up
from nitro.scaling.noise import b_simple_of, cost_optimal_batch, ema_terms

MAX_REPLAY_ROUNDS = 100_000  # the longest actors_by_round list (nitro.spec.MAX_ROUNDS)


def _positive_int(policy: str, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"invalid value for {policy}.{field}: must be an integer >= 1, got {value!r}")
    return value


def _decay(policy: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 < value <= 1.0:
        raise ConfigError(f"invalid value for {policy}.{field}: must be a number in (0, 1], got {value!r}")
    return float(value)


def parse_actor_counts(value, field: str = "replay.actors_by_round") -> tuple[int, ...]:
    """Actor counts per round from a sequence of integers or a comma-separated string ("8,16,12").

    ConfigError naming `field` for an empty list, a count that is not an integer >= 1, or a list
    longer than MAX_REPLAY_ROUNDS.
    """
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")] if value.strip() else []
        counts = []
        for p in parts:
            try:
                counts.append(int(p))
            except ValueError:
                raise ConfigError(f"invalid value for {field}: {p!r} is not an integer (expected comma-separated "
                                  "actor counts, e.g. '8,16,12')") from None
    elif isinstance(value, (list, tuple)):
        counts = list(value)
    else:
        raise ConfigError(f"invalid value for {field}: must be a list of actor counts or a comma-separated "
                          f"string, got {value!r}")
    if not counts:
        raise ConfigError(f"invalid value for {field}: needs at least one actor count")
    if len(counts) > MAX_REPLAY_ROUNDS:
        raise ConfigError(f"invalid value for {field}: at most {MAX_REPLAY_ROUNDS} rounds, got {len(counts)}")
    for i, n in enumerate(counts):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"invalid value for {field}[{i}]: must be an integer >= 1, got {n!r}")
    return tuple(counts)


def format_actor_counts(counts) -> str:
    """The comma-separated form ScalerSpec.actors_by_round carries on the wire."""
    return ",".join(str(int(n)) for n in counts)


@dataclass(frozen=True)
class NitroPolicy:
    name: str = "nitro"
    reads_score = True  # a plan without a boosting score falls back (scaler_svc); the others ignore the score

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        s = inputs.score if math.isfinite(inputs.score) else 0.0  # an unusable score spends the minimum
        s = min(max(s, 0.0), 1.0)
        raw = round_half_up(inputs.i_max * s)
        actors = clip(raw, inputs.i_min, inputs.i_max)
        return actors, dict(state), f"nitro: S_k={s:.4f}, round({inputs.i_max}*S_k)={raw}, clipped to {actors}"


@dataclass(frozen=True)
class FixedPolicy:
    actors: int = FIXED_ACTORS
    name: str = "fixed"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        return self.actors, dict(state), f"fixed: {self.actors} actors every round"


@dataclass(frozen=True)
class MaxPolicy:
    name: str = "max"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        return inputs.i_max, dict(state), f"max: I_max={inputs.i_max}"


@dataclass(frozen=True)
class HydrozoaPolicy:
    every: int = 10
    name: str = "hydrozoa"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        doublings = inputs.round_index // self.every
        # Capping the exponent keeps 2**d small; 63 doublings exceed any I_max.
        actors = min(inputs.i_min * 2 ** min(doublings, 63), inputs.i_max)
        return actors, dict(state), f"hydrozoa: {doublings} doubling(s) after {inputs.round_index} rounds"


@dataclass(frozen=True)
class KungFuPolicy:
    reference: float | None = None  # B_ref; None = anchor on the first known noise scale
    name: str = "kungfu"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        prev = int(state.get("actors", 0))
        ref = state.get("reference", self.reference)
        b = inputs.noise_scale
        if b is None or not math.isfinite(b) or b <= 0:
            target, why = max(prev, inputs.i_min), "noise scale unknown, keeping the previous size"
        else:
            ref = float(b) if ref is None else float(ref)
            target = round_half_up(inputs.i_min * b / ref)
            why = f"B_noise={b:.4g}, B_ref={ref:.4g} -> {target}"
        actors = clip(max(target, prev), inputs.i_min, inputs.i_max)  # never scale down
        new_state = dict(state, actors=actors)
        if ref is not None:
            new_state["reference"] = float(ref)
        return actors, new_state, f"kungfu: {why}; never down from {prev}, clipped to {actors}"


@dataclass(frozen=True)
class SchedulePolicy:
    """The decay without the detector: clip(round(I_max * d^k), I_min, I_max)."""

    decay: float = SCORE_DECAY
    name: str = "schedule"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        k = inputs.round_index
        raw = round_half_up(inputs.i_max * self.decay ** k)
        actors = clip(raw, inputs.i_min, inputs.i_max)
        return actors, dict(state), (f"schedule: round({inputs.i_max}*{self.decay:g}^{k})={raw}, "
                                     f"clipped to {actors}")


@dataclass(frozen=True)
class ReplayPolicy:
    """Plays `actors_by_round` (round k gets entry k, the last entry after the end), clipped to [I_min, I_max]."""

    actors_by_round: tuple[int, ...] = (1,)
    name: str = "replay"  # "noise-replay": the same rule, replaying a noise run's counts (the protocol's control)

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        k = inputs.round_index
        i = min(k, len(self.actors_by_round) - 1)
        wanted = self.actors_by_round[i]
        actors = clip(wanted, inputs.i_min, inputs.i_max)
        where = f"entry {i}" if i == k else f"past the list's end ({len(self.actors_by_round)} rounds), last entry"
        return actors, dict(state), f"{self.name}: {where} = {wanted}, clipped to {actors}"


@dataclass(frozen=True)
class NitroFloorPolicy:
    """nitro floored at round(F * d_f^(k^2)) (the authors' artifact), clipped to [I_min, I_max]."""

    floor_actors: int = FLOOR_ACTORS
    floor_decay: float = FLOOR_DECAY
    name: str = "nitro-floor"
    reads_score = True

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        nitro, _, why = NitroPolicy().decide(state, inputs)
        k = inputs.round_index
        floor = round_half_up(self.floor_actors * self.floor_decay ** (k * k))
        actors = clip(max(nitro, floor), inputs.i_min, inputs.i_max)
        return actors, dict(state), (f"nitro-floor: {why.removeprefix('nitro: ')}; floor round({self.floor_actors}*"
                                     f"{self.floor_decay:g}^{k * k})={floor} -> {actors}")


def job_progress(inputs: RoundInputs) -> tuple[float, str]:
    """How far the job is, in [0, 1], and how that was measured: the larger of the budget fraction spent and the
    fraction of its planned rounds done, so a job that ends on rounds rather than dollars still progresses."""
    spent = None
    if inputs.budget_usd and inputs.budget_usd > 0 and inputs.budget_left_usd is not None \
            and math.isfinite(inputs.budget_left_usd):
        spent = min(max(1.0 - inputs.budget_left_usd / inputs.budget_usd, 0.0), 1.0)
    done = min(inputs.round_index / inputs.rounds, 1.0) if inputs.rounds > 0 else None
    if spent is None and done is None:
        return 0.0, "progress unknown"
    if done is None or (spent is not None and spent >= done):
        return spent, f"{spent:.1%} of the budget spent"
    return done, f"{inputs.round_index}/{inputs.rounds} rounds done"


def _fraction(policy: str, field: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ConfigError(f"invalid value for {policy}.{field}: must be a number in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GrowPolicy:
    """I_min, then 2 * I_min from progress f1, then 4 * I_min from f2 (job_progress), clipped, never down."""

    f1: float = GROW_FRACTIONS[0]
    f2: float = GROW_FRACTIONS[1]
    name: str = "grow"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        progress, why = job_progress(inputs)
        factor = 1 if progress < self.f1 else 2 if progress < self.f2 else 4
        prev = int(state.get("actors", 0))
        actors = clip(max(inputs.i_min * factor, prev), inputs.i_min, inputs.i_max)
        return actors, dict(state, actors=actors), (f"grow: {why} (f1={self.f1:g}, f2={self.f2:g}) -> "
                                                    f"{factor} x I_min, clipped to {actors}")


def nearest_power_of_two(x: float) -> int:
    """2^round(log2(x)) for x > 0 (halves up in log space: 5.66 -> 8); 1 below 1."""
    return 1 if x <= 1.0 else 2 ** round_half_up(math.log2(x))


@dataclass(frozen=True)
class NoisePolicy:
    """clip(pow2(kappa * sqrt(B_simple * a / c) / steps_per_actor), I_min, I_max), never down, B_simple the ratio
    of the policy gradient's averaged noise terms; with anything unknown (no positive |G|^2 yet, no costs), the
    previous count (I_min at first)."""

    kappa: float = NOISE_KAPPA
    ema: float = NOISE_EMA
    name: str = "noise"  # "noise-adascale": the same counts; the learner scales its update (scales_update)

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        prev = int(state.get("actors", 0))
        before = (state["grad_sq"], state["trace_sigma"]) if "grad_sq" in state else None
        terms = ema_terms(before, inputs.policy_noise_terms, self.ema)
        b = b_simple_of(terms)
        a, c, steps = inputs.round_cost_usd, inputs.sample_cost_usd, inputs.steps_per_actor
        if b is None:
            target, why = inputs.i_min, ("no gradient noise scale yet" if terms is None else
                                         f"averaged |G|^2 = {terms[0]:.3g} <= 0: noise scale unknown")
        elif not (a > 0 and c > 0 and steps > 0 and math.isfinite(a) and math.isfinite(c)):
            target, why = inputs.i_min, f"B_simple={b:.4g}, round costs unknown"
        else:
            batch = self.kappa * cost_optimal_batch(b, a, c) if b > 0 else 0.0
            target = nearest_power_of_two(batch / steps)
            why = (f"B_simple={b:.4g} (averaged terms), a=${a:.3g}, c=${c:.3g}/sample: {self.kappa:g} x "
                   f"sqrt(B a / c) = {batch:.0f} samples = {batch / steps:.2f} actors -> {target}")
        actors = clip(max(target, prev), inputs.i_min, inputs.i_max)
        new_state = dict(state, actors=actors)
        if terms is not None:
            new_state.update(grad_sq=terms[0], trace_sigma=terms[1])
        return actors, new_state, f"{self.name}: {why}; never down from {prev}, clipped to {actors}"


def scales_update(name: str) -> bool:
    """Whether the policy called `name` has the learner scale its update to the round's size (AdaScale)."""
    return split_policy(name)[0] == "noise-adascale"


def fleet_actors(policy: ScalingPolicy, i_max: int) -> int:
    """The most actors `policy` can run in a round: what a serverful fleet for the job must hold.

    I_max bounds every policy but `fixed`, whose count ignores the range.
    """
    return policy.actors if isinstance(policy, FixedPolicy) else i_max


def reads_score(name: str) -> bool:
    """Whether the policy called `name` plans from the boosting score; the learner asks the detector only then.

    By name, without building the policy (minions' checkpoint lives with the scaler, not the learner).
    """
    score_readers = {"nitro": NitroPolicy, "nitro-floor": NitroFloorPolicy}
    cls = score_readers.get(split_policy(name)[0])
    return bool(cls is not None and cls.reads_score)


def split_policy(text: str) -> tuple[str, int | None]:
    """A scaling policy as written ("nitro", "fixed", "fixed:16"): its name and the actor count written after ':'
    (None without one). The one parser of the "fixed:N" shorthand: make_policy reads names with it, and
    nitro.spec.parse_policy (the CLI's --scaler, spec files, the wire) wraps it to name the field. Only "fixed"
    takes a count; ConfigError otherwise, or for a count that is no integer. Names are not checked here."""
    policy, sep, count = str(text).strip().partition(":")
    if not sep:
        return policy, None
    if policy != "fixed":
        raise ConfigError(f"{text!r}: only 'fixed' takes an actor count, e.g. 'fixed:16'")
    try:
        return policy, int(count)
    except ValueError:
        raise ConfigError(f"{text!r}: fixed.actors, the count after ':', must be an integer, e.g. 'fixed:16'") \
            from None


def make_policy(name: str, params: dict | None = None) -> ScalingPolicy:
    """The policy called `name` ("nitro", "fixed", "fixed:16", "max", "hydrozoa", "kungfu", "minions", "schedule",
    "replay", "nitro-floor", "grow", "noise", "noise-adascale", "noise-replay") with `params`.

    "minions" loads its checkpoint (params["scheduler"], cached per path): SchedulerCheckpointError
    for a missing or corrupt file, SchedulerMismatchError for one of another format or layout.
    """
    params = dict(params or {})
    base, count = split_policy(name)
    if base not in SCALING_POLICIES:
        raise ConfigError(f"unknown scaling policy {name!r}; allowed: {list(SCALING_POLICIES)} (or 'fixed:N')")
    if base == "fixed":
        check_params(base, params, {"actors"})
        if count is not None:
            if "actors" in params and params["actors"] != count:
                raise ConfigError(f"fixed.actors given twice: {name!r} and actors={params['actors']!r}")
            params["actors"] = count
        return FixedPolicy(_positive_int(base, "actors", params.get("actors", FIXED_ACTORS)))
    if base == "hydrozoa":
        check_params(base, params, {"every"})
        return HydrozoaPolicy(_positive_int(base, "every", params.get("every", HYDROZOA_PERIOD)))
    if base == "kungfu":
        check_params(base, params, {"reference"})
        ref = params.get("reference")
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, (int, float))
                                or not math.isfinite(ref) or ref <= 0):
            raise ConfigError(f"invalid value for kungfu.reference: must be a finite number > 0, got {ref!r}")
        return KungFuPolicy(None if ref is None else float(ref))
    if base == "minions":
        check_params(base, params, {"scheduler"})
        from nitro.scaling.minions import MinionsPolicy, load_scheduler_cached  # numpy; loaded on demand

        return MinionsPolicy(load_scheduler_cached(params.get("scheduler") or ""))
    if base == "schedule":
        check_params(base, params, {"decay"})
        return SchedulePolicy(_decay(base, "decay", params.get("decay", SCORE_DECAY)))
    if base in ("replay", "noise-replay"):
        check_params(base, params, {"actors_by_round"})
        if "actors_by_round" not in params:
            raise ConfigError(f"missing value for {base}.actors_by_round: the actor counts to play, one per round")
        return ReplayPolicy(parse_actor_counts(params["actors_by_round"], f"{base}.actors_by_round"), name=base)
    if base == "grow":
        check_params(base, params, {"f1", "f2"})
        f1 = _fraction(base, "f1", params.get("f1", GROW_FRACTIONS[0]))
        f2 = _fraction(base, "f2", params.get("f2", GROW_FRACTIONS[1]))
        if f2 < f1:
            raise ConfigError(f"invalid value for grow.f2: must be >= grow.f1 ({f1:g}), got {f2:g}")
        return GrowPolicy(f1, f2)
    if base in ("noise", "noise-adascale"):
        check_params(base, params, {"kappa", "ema"})
        kappa = params.get("kappa", NOISE_KAPPA)
        if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not math.isfinite(kappa) or kappa <= 0:
            raise ConfigError(f"invalid value for {base}.kappa: must be a finite number > 0, got {kappa!r}")
        return NoisePolicy(float(kappa), _decay(base, "ema", params.get("ema", NOISE_EMA)), name=base)
    if base == "nitro-floor":
        check_params(base, params, {"floor_actors", "floor_decay"})
        return NitroFloorPolicy(_positive_int(base, "floor_actors", params.get("floor_actors", FLOOR_ACTORS)),
                                _decay(base, "floor_decay", params.get("floor_decay", FLOOR_DECAY)))
    check_params(base, params, set())
    return NitroPolicy() if base == "nitro" else MaxPolicy()
