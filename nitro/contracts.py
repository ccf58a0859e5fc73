"""What every nitro process agrees on, in one place: a job's Redis keys, job and invocation ids,
the scaling policy names and the defaults that the spec, the services and the algorithm cores share.

Services, actors and the local Redis's ACL rules all build keys here, so a key can only change here.
Imports nothing of nitro: the torch-free actor and every service can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# -- job ids ------------------------------------------------------------------------------------------

JOB_ID_PATTERN = r"[A-Za-z0-9_-]{1,64}"
JOB_ID_RULE = "1-64 characters of letters, digits, '-' or '_'"
_JOB_ID = re.compile(JOB_ID_PATTERN)


def is_job_id(value: object) -> bool:
    """Whether `value` is a valid job id (the whole string: no trailing newline slips through)."""
    return isinstance(value, str) and _JOB_ID.fullmatch(value) is not None


def check_job_id(job_id: object) -> str:
    """`job_id` itself, else ValueError: a key is never built from an id that could reach another job's keys."""
    if not is_job_id(job_id):
        raise ValueError(f"job_id must be {JOB_ID_RULE}, got {job_id!r}")
    return job_id


# -- Redis keys of a job ------------------------------------------------------------------------------
# nitro:{job}:policy:{v}        signed policy version v (actors GET it)
# nitro:{job}:policy:latest     the newest published version
# nitro:{job}:traj              trajectory stream (actors XADD, the learner reads with a consumer group)
# nitro:{job}:seen              invocation ids already consumed (dedup)
# nitro:{job}:sample:{k}        round k's signed sample subset for the detector
# nitro:{job}:waves:{k}         round k's replacement waves (on-policy loop)
# nitro:{job}:waves:{k}:live:{w} wave w of round k is running: the scaler's lease while its invocations run
# nitro:{job}:detector:ratios   hash round -> convexity ratio R
# nitro:{job}:scaler            hash: scaling-policy state, cost ledger, per-round plans
# nitro:{job}:learn:counter     Stellaris learner-function slots
# nitro:{job}:learn:parcel:{i}  the signed input of learner function i
# nitro:{job}:learn:updates     stream of learner functions' updates
# nitro:{job}:learn:staleness   signed staleness record: each base's staleness, written before each version

KEY_PREFIX = "nitro"


def _key(job_id: str, *parts: object) -> str:
    return ":".join((KEY_PREFIX, job_id, *map(str, parts)))


def _version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    return version


def policy_key(job_id: str, version: int) -> str:
    return _key(check_job_id(job_id), "policy", _version(version))


def latest_policy_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "policy", "latest")


def stream_key(job_id: str) -> str:
    """The job's trajectory stream."""
    return _key(check_job_id(job_id), "traj")


def seen_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "seen")


def sample_key(job_id: str, round_index: int) -> str:
    return _key(check_job_id(job_id), "sample", int(round_index))


def waves_key(job_id: str, round_index: int) -> str:
    return _key(check_job_id(job_id), "waves", int(round_index))


def wave_live_key(job_id: str, round_index: int, wave: int) -> str:
    """The liveness lease of round k's wave w: present while the scaler runs the wave's invocations."""
    return waves_key(job_id, round_index) + f":live:{int(wave)}"


# A wave's lease is refreshed this often and lapses this long after the last refresh: a few missed
# refreshes (a slow Redis call, a GC pause) do not end it; a dead scaler's waves stop looking alive soon.
WAVE_LEASE_REFRESH_S = 2.0
WAVE_LEASE_TTL_S = 3 * WAVE_LEASE_REFRESH_S


def detector_ratios_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "detector", "ratios")


def scaler_state_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "scaler")


def learn_prefix(job_id: str) -> str:
    """Every Stellaris key of the job starts with this; learner functions may read only below it."""
    return _key(check_job_id(job_id), "learn", "")


def learn_counter_key(job_id: str) -> str:
    return learn_prefix(job_id) + "counter"


def parcel_key(job_id: str, invocation: str) -> str:
    return learn_prefix(job_id) + f"parcel:{invocation}"


def update_stream_key(job_id: str) -> str:
    return learn_prefix(job_id) + "updates"


def staleness_record_key(job_id: str) -> str:
    """The Stellaris service's signed `StalenessLedger.record`, written before each version it publishes (so a
    learner that reads `policy:latest` and then the record sees a record at least as new as that version)."""
    return learn_prefix(job_id) + "staleness"


def is_learn_key(job_id: str, key: str) -> bool:
    """Whether `key` lies under the job's learn: prefix (a learner invocation's payload_ref must)."""
    return is_job_id(job_id) and isinstance(key, str) and key.startswith(learn_prefix(job_id))


# Key patterns of the local Redis's ACL users: services own every nitro key; actors and learner
# functions may touch only trajectory streams, policies and the learn: keys.
ALL_KEYS_PATTERN = f"{KEY_PREFIX}:*"
ACTOR_KEY_PATTERNS = (_key("*", "traj"), _key("*", "policy", "*"), _key("*", "learn", "*"))


# -- invocation ids ---------------------------------------------------------------------------------
# "{job}-r{round}-{a|g}{slot}" plus "-x{wave}" for a replacement wave: deterministic, so a retried
# invocation carries the same id and the stream drops the copy.

KIND_LETTERS = {"actor": "a", "learner": "g"}
FUNCTION_KINDS = tuple(KIND_LETTERS)  # what a launch invokes: actors, or learner functions (stellaris)
_KINDS = {v: k for k, v in KIND_LETTERS.items()}
_INVOCATION_ID = re.compile(rf"({JOB_ID_PATTERN})-r(\d+)-([ag])(\d+)(?:-x([1-9]\d*))?")


@dataclass(frozen=True)
class InvocationId:
    job_id: str
    round_index: int
    slot: int
    kind: str = "actor"  # "actor" samples; "learner" is a Stellaris learner function
    wave: int = 0

    def __str__(self) -> str:
        return invocation_id(self.job_id, self.round_index, self.slot, kind=self.kind, wave=self.wave)


def invocation_id(job_id: str, round_index: int, slot: int, wave: int = 0, *, kind: str = "actor") -> str:
    if kind not in KIND_LETTERS:
        raise ValueError(f"kind must be one of {list(KIND_LETTERS)}, got {kind!r}")
    if min(round_index, slot, wave) < 0:
        raise ValueError(f"round, slot and wave must be >= 0, got {round_index}, {slot}, {wave}")
    base = f"{check_job_id(job_id)}-r{round_index}-{KIND_LETTERS[kind]}{slot}"
    return base if wave == 0 else f"{base}-x{wave}"


def parse_invocation_id(text: str) -> InvocationId | None:
    """The parts of an invocation id, else None (anything else in a stream is not one of ours)."""
    m = _INVOCATION_ID.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    job_id, k, letter, slot, wave = m.groups()
    return InvocationId(job_id, int(k), int(slot), _KINDS[letter], int(wave or 0))


def actor_slot(text: str, job_id: str, round_index: int) -> int | None:
    """The actor slot of an invocation id of this job and round (any wave), else None."""
    inv = parse_invocation_id(text)
    if inv is None or inv.kind != "actor" or inv.job_id != job_id or inv.round_index != round_index:
        return None
    return inv.slot


# -- scaling policies and shared defaults -----------------------------------------------------------

SCALING_POLICIES = ("nitro", "fixed", "max", "hydrozoa", "kungfu", "minions", "schedule", "replay", "nitro-floor",
                    "grow", "noise", "noise-adascale", "noise-replay")
DEFAULT_SCALING_POLICY = "fixed"  # a fixed count beat nitro on return at equal modelled dollars (docs/results.md)
DEFAULT_I_MIN, DEFAULT_I_MAX = 8, 64  # every policy's actor range but fixed's (the paper's Table 1)
FIXED_ACTORS = 8  # "fixed" with no count and no algorithm (a bare FixedPolicy, a ScalerSpec without one): PPO's count
# "fixed" per algorithm (docs/results.md). PPO: fixed:8, the count that won on return at equal modelled dollars
# (Hopper-v5 and Walker2d-v5, 10 seeds: above nitro, fixed:N-bar and the rest); IMPACT: fixed:16, the highest IQM at
# equal dollars (Hopper-v5: above fixed:8 on 5 seeds, P 0.84 [0.52, 1.00]; level on 10, P 0.61 [0.36, 0.84], as are
# nitro and N-bar).
FIXED_ACTORS_BY_ALGO = {"ppo": 8, "impact": 16}
HYDROZOA_PERIOD = 10  # "hydrozoa": rounds between changes
FLOOR_ACTORS = 64  # "nitro-floor": F of the floor round(F * d_f^(k^2)) (the authors' artifact)
FLOOR_DECAY = 0.96  # "nitro-floor": d_f
GROW_FRACTIONS = (0.4, 0.8)  # "grow": budget fractions f1, f2 at which I_min doubles, then doubles again
# "noise" / "noise-adascale": N = kappa * sqrt(B_simple * a / c) / steps per actor (docs/scaling.md). kappa = 1 is
# McCandlish et al.'s cost-optimal batch, and the default until the fit on Hopper-v5 seeds 0-9 (docs/results.md,
# "Scaling by the gradient noise scale") replaces it; that value is then frozen for every other run.
NOISE_KAPPA = 1.0
NOISE_EMA = 0.2  # weight of the newest B_simple in the exponential moving average both the scaler and learner keep


# Lambda gives a function CPU in proportion to its memory: one full vCPU at 1,769 MB (AWS Lambda developer guide,
# "Configure Lambda function memory"). An actor is single-threaded and CPU-bound, so below that size it runs
# 1769/M times longer for the same GB-seconds, and above it pays for vCPUs it cannot use: 1,769 MB is the
# cheapest size per sample (docs/cost.md works it out), and the default.
LAMBDA_FULL_VCPU_MB = 1769
DEFAULT_ACTOR_MEMORY_MB = LAMBDA_FULL_VCPU_MB


def default_fixed_actors(algo: str) -> int:
    """Actors per round of "fixed" when the spec gives no count: the algorithm's, else FIXED_ACTORS."""
    return FIXED_ACTORS_BY_ALGO.get(algo, FIXED_ACTORS)


# The boosting detector and score (paper 5.1): the subset scored, the window of ratios, the decay.
DETECTOR_SUBSET = 512
LANCZOS_STEPS = 20
SCORE_WINDOW = 6
SCORE_DECAY = 0.96

# Several environments per actor (nitro/policy/rollout.py VecSampler). The default stays 1 (the single-env path
# every learning result in docs/results.md was measured with): 16 envs sample ~1.3x faster per CPU second
# (bench/actor_sampling.py), but cut each 512-step batch into 32-step segments that bootstrap from the critic,
# and no learning comparison at equal steps has been run yet (docs/algorithms.md).
MAX_ENVS_PER_ACTOR = 256
DEFAULT_ENVS_PER_ACTOR = 1
MIN_STEPS_PER_ENV = 32  # an actor runs at most steps_per_actor // 32 envs (at least 1): no segment is shorter

# A learner loop fails the job after this many consecutive rounds without a single batch.
MAX_EMPTY_ROUNDS = 3
