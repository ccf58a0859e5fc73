"""What every nitro process agrees on, in one place: a job's Redis keys, job and invocation ids,
the scaling policy names and the defaults that the spec, the services and the algorithm cores share.

Services, actors and the local Redis's ACL rules all build keys here, so a key can only change here.
Imports nothing of nitro: the torch-free actor and every service can use it.
"""

from __future__ import annotations

import hmac
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
# nitro:{job}:launches:{k}     hash: round k's invocations -> running / done with the result (nitro.launches)
# nitro:{job}:launch-owner:{t} a Launch call is running: the scaler's lease while its invocations run
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


def launches_key(job_id: str, round_index: int) -> str:
    """Round k's invocation records: invocation id -> running or done, with its result (nitro.launches)."""
    return _key(check_job_id(job_id), "launches", int(round_index))


def launch_owner_key(job_id: str, owner: str) -> str:
    """The liveness lease of one Launch call (`owner`: a random token): present while it runs invocations."""
    if not re.fullmatch(r"[0-9a-f]{16,64}", owner):
        raise ValueError(f"owner must be 16-64 lowercase hex digits, got {owner!r}")
    return _key(check_job_id(job_id), "launch-owner", owner)


# A Launch's lease is refreshed this often and lapses this long after the last refresh: a few missed
# refreshes (a slow Redis call, a GC pause) do not end it; a dead scaler's launches stop looking alive soon.
LAUNCH_LEASE_REFRESH_S = 2.0
LAUNCH_LEASE_TTL_S = 3 * LAUNCH_LEASE_REFRESH_S
# Invocation records outlive a retried Launch and the resume of a crashed job by far; a day, not the scaler
# hash's week: a long job writes one record per invocation.
LAUNCH_RECORD_TTL_S = 24 * 3600


def detector_ratios_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "detector", "ratios")


def scaler_state_key(job_id: str) -> str:
    return _key(check_job_id(job_id), "scaler")


SCALER_STATE_TTL_S = 7 * 24 * 3600  # the scaler hash lives this long after its last write


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


# Key patterns of Redis's ACL users: services own every nitro key; a job's functions (its actors and Stellaris
# learner functions) log in as the job's own user, which may touch only that job's trajectory stream, policies and
# learn: keys (nitro.data.redis_acl holds the commands; the scaler creates and deletes the users).
ALL_KEYS_PATTERN = f"{KEY_PREFIX}:*"
ACTOR_USER_PREFIX = "nitro-actor-"


def actor_user(job_id: str) -> str:
    """The Redis ACL user of job `job_id`'s functions: "nitro-actor-{job}"."""
    return ACTOR_USER_PREFIX + check_job_id(job_id)


def job_of_actor_user(name: str) -> str | None:
    """The job whose functions' user `name` is, else None (another user: a service's, or not nitro's)."""
    if not isinstance(name, str) or not name.startswith(ACTOR_USER_PREFIX):
        return None
    job_id = name[len(ACTOR_USER_PREFIX):]
    return job_id if is_job_id(job_id) else None


def actor_key_patterns(job_id: str) -> tuple[str, ...]:
    """The keys job `job_id`'s functions may touch: its stream, its policies, its learn: keys. Job ids hold no
    glob character, so a pattern matches that job's keys only."""
    return stream_key(job_id), _key(check_job_id(job_id), "policy", "*"), learn_prefix(job_id) + "*"


# -- evaluation functions ------------------------------------------------------------------------------
MAX_EVAL_FUNCTIONS = 16  # an evaluation's episodes are spread over at most this many functions


def eval_episodes_per_function(episodes: int) -> int:
    """Episodes each evaluation function runs: one each, up to MAX_EVAL_FUNCTIONS functions."""
    return max(1, -(-episodes // MAX_EVAL_FUNCTIONS))


def eval_slices(episodes: int, per_function: int) -> list[tuple[int, int]]:
    """(first episode, episodes) of each evaluation function's slot: slot i runs episodes [i * per_function,
    min((i + 1) * per_function, episodes)), so together they run episodes 0 .. episodes - 1 exactly once."""
    if episodes < 1 or not 1 <= per_function <= episodes:
        raise ValueError(f"episodes must be >= 1 and per_function in [1, episodes], got {episodes}, {per_function}")
    return [(start, min(per_function, episodes - start)) for start in range(0, episodes, per_function)]


# -- invocation ids ---------------------------------------------------------------------------------
# "{job}-r{round}-{a|g}{slot}" plus "-x{wave}" for a replacement wave: deterministic, so a retried
# invocation carries the same id and the stream drops the copy.

KIND_LETTERS = {"actor": "a", "learner": "g", "eval": "e"}
# What a launch invokes: actors, learner functions (stellaris), or evaluation functions (the actor function
# running deterministic episodes of a published version, off the learner's critical path).
FUNCTION_KINDS = tuple(KIND_LETTERS)
_KINDS = {v: k for k, v in KIND_LETTERS.items()}
_LETTERS = "".join(KIND_LETTERS.values())
_INVOCATION_ID = re.compile(rf"({JOB_ID_PATTERN})-r(\d+)-([{_LETTERS}])(\d+)(?:-x([1-9]\d*))?")


@dataclass(frozen=True)
class InvocationId:
    job_id: str
    round_index: int
    slot: int
    kind: str = "actor"  # "actor" samples; "learner" is a Stellaris learner function; "eval" evaluates
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


# -- signing keys of a job and of its invocations ------------------------------------------------------
# The services hold the deployment's master key (NITRO_HMAC_KEY) and derive every other key from it; it never
# leaves them. An invocation gets two derived keys in its event (FunctionCredentials), never the master:
#   invocation key  HMAC-SHA256(master, "nitro-invocation-key|{job}|{invocation}")  signs what the function
#                   sends back (a trajectory batch, a Stellaris update); the learner derives it again from the
#                   invocation id the entry names, so a batch verifies only as that invocation's of that job
#   job read key    HMAC-SHA256(master, "nitro-job-read-key|{job}")  signs what the learner publishes for the
#                   job (policies, sample subsets, Stellaris parcels and staleness records), which the job's
#                   functions verify; they may read those keys but not write them (their ACL user)
# Job ids hold no "|", so the label, the job and the invocation id cannot run into each other.

INVOCATION_KEY_LABEL = "nitro-invocation-key"
JOB_READ_KEY_LABEL = "nitro-job-read-key"


def _derive(master: bytes, *parts: str) -> bytes:
    if not isinstance(master, (bytes, bytearray)) or not master:
        raise TypeError("the master key must be non-empty bytes")
    return hmac.digest(bytes(master), "|".join(parts).encode("utf-8", "surrogateescape"), "sha256")


def invocation_key(master: bytes, job_id: str, invocation: str) -> bytes:
    """The key invocation `invocation` of job `job_id` signs with (32 bytes)."""
    if not isinstance(invocation, str) or not invocation:
        raise ValueError("invocation must be a non-empty str")
    return _derive(master, INVOCATION_KEY_LABEL, check_job_id(job_id), invocation)


def job_read_key(master: bytes, job_id: str) -> bytes:
    """The key the learner signs job `job_id`'s published data with, and its functions verify it with."""
    return _derive(master, JOB_READ_KEY_LABEL, check_job_id(job_id))


CREDENTIALS_FIELD = "credentials"  # the event field that carries an invocation's FunctionCredentials
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_PASSWORD = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")


@dataclass(frozen=True)
class FunctionCredentials:
    """What one invocation gets to do its work and nothing more: its job's Redis user and password, its own
    signing key and its job's read key (hex). Built by the scaler per invocation, read by the handlers; the
    values are secrets (never in a repr, a log line or an error)."""

    redis_username: str
    redis_password: str
    signing_key: str
    read_key: str

    def __repr__(self) -> str:
        return f"FunctionCredentials(redis_username={self.redis_username!r}, ...)"

    def to_event(self) -> dict:
        return {"redis_username": self.redis_username, "redis_password": self.redis_password,
                "signing_key": self.signing_key, "read_key": self.read_key}

    @classmethod
    def from_event(cls, event: object, job_id: str) -> FunctionCredentials:
        """The event's credentials for job `job_id`; ValueError naming the field that is missing or malformed
        (never its value)."""
        creds = event.get(CREDENTIALS_FIELD) if isinstance(event, dict) else None
        if not isinstance(creds, dict):
            raise ValueError(f"event field {CREDENTIALS_FIELD!r} is missing or not an object: the scaler gives every "
                             "invocation its job's Redis user and its keys")
        user = creds.get("redis_username")
        if user != actor_user(job_id):
            raise ValueError(f"event field '{CREDENTIALS_FIELD}.redis_username' must be {actor_user(job_id)!r}, "
                             "the user of the event's job")
        if not isinstance(creds.get("redis_password"), str) or not _PASSWORD.fullmatch(creds["redis_password"]):
            raise ValueError(f"event field '{CREDENTIALS_FIELD}.redis_password' must be 16-512 characters of "
                             "[A-Za-z0-9._~+/=-]")
        for name in ("signing_key", "read_key"):
            if not isinstance(creds.get(name), str) or not _HEX_KEY.fullmatch(creds[name]):
                raise ValueError(f"event field '{CREDENTIALS_FIELD}.{name}' must be 64 lowercase hex characters")
        return cls(user, creds["redis_password"], creds["signing_key"], creds["read_key"])

    @property
    def signing_key_bytes(self) -> bytes:
        return bytes.fromhex(self.signing_key)

    @property
    def read_key_bytes(self) -> bytes:
        return bytes.fromhex(self.read_key)


def function_credentials(master: bytes, job_id: str, invocation: str, redis_password: str) -> FunctionCredentials:
    """The credentials of invocation `invocation` of job `job_id` (the scaler's, per invocation)."""
    return FunctionCredentials(actor_user(job_id), redis_password, invocation_key(master, job_id, invocation).hex(),
                               job_read_key(master, job_id).hex())


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
# McCandlish et al.'s cost-optimal batch; this is the value fitted on Hopper-v5 seeds 0-9 (1.2455, rounded;
# `python -m experiments sequential --fit-kappa`, docs/results/evidence/kappa-fit-40.json, docs/results.md
# "Growing rounds"), frozen for every other run.
NOISE_KAPPA = 1.25
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
# Where a job's evaluation episodes run (TrainingSpec.evaluation): serverless evaluation functions in parallel with
# the next round, or the learner between rounds (docs/evaluation.md).
EVALUATIONS = ("functions", "learner")
DEFAULT_EVALUATION = "functions"
MIN_STEPS_PER_ENV = 32  # an actor runs at most steps_per_actor // 32 envs (at least 1): no segment is shorter

# A learner loop fails the job after this many consecutive rounds without a single batch.
MAX_EMPTY_ROUNDS = 3
