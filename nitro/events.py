"""The invocation events: what the scaler sends a Lambda function, typed and validated in one place.

The scaler builds an event (ActorEvent for an actor, LearnerEvent for a Stellaris learner function, EvalEvent for
an evaluation function), sends
`to_dict()` as the JSON payload, and the handler reads it back with `from_dict`. Both directions run the same
checks (the dataclass's __post_init__), so a field the producer sets and the consumer does not know, a missing
field or a value out of range is a ConfigError naming the field and what is allowed, on either side. An unknown
field is refused rather than ignored: a misspelt optional field would otherwise change nothing, silently.

Secrets travel in `credentials` (nitro.contracts.FunctionCredentials); no error here echoes a value of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nitro.contracts import (
    CREDENTIALS_FIELD,
    JOB_ID_RULE,
    MAX_ENVS_PER_ACTOR,
    FunctionCredentials,
    is_job_id,
    is_learn_key,
    learn_prefix,
)
from nitro.errors import ConfigError

MAX_STEPS = 1_000_000  # an actor invocation's num_steps (the scaler's steps_per_actor bound too)
MAX_EVAL_EPISODES = 1000  # an evaluation's episodes (TrainingSpec.eval_episodes' bound too)
EVAL_KIND = "eval"  # the field that tells the actor function an event is an evaluation (EvalEvent.kind)
# Redis's default proto-max-bulk-len (nitro.data.store.REDIS_MAX_BULK_BYTES, not imported: the scaler and the
# functions read this module without the data plane's imports); tests/test_wire_events.py checks they agree.
MAX_ENTRY_BYTES_LIMIT = 512 << 20


def _fail(name: str, rule: str, value: object) -> ConfigError:
    return ConfigError(f"event field {name!r} must be {rule}, got {value!r}")


def _int(name: str, value: object, low: int = 0, high: int | None = None) -> None:
    """An integer (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        rule = f"an integer in [{low}, {high}]" if high is not None else \
            "a non-negative integer" if low == 0 else f"an integer >= {low}"
        raise _fail(name, rule, value)


def _str(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise _fail(name, "a non-empty string", value)


def _parse(cls, event: object) -> dict:
    """The event's fields as keyword arguments of `cls`; ConfigError naming a missing or unknown field."""
    if not isinstance(event, dict):
        raise ConfigError(f"event must be a JSON object, got {type(event).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(event) - set(known))
    if unknown:
        raise ConfigError(f"event has unknown field(s) {unknown}; allowed: {sorted(known)}")
    for name, f in known.items():  # in declaration order: the identity first, the credentials last
        if name not in event and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"event is missing required field {name!r}")
    return dict(event)


def _default(f: dataclasses.Field) -> object:
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


@dataclass(frozen=True, kw_only=True)
class _Event:
    """What every invocation event carries: whose, which round and version, its id, its credentials and where
    Redis is. `credentials` given as a dict (the JSON's) is read with FunctionCredentials.from_event once job_id
    is known valid."""

    job_id: str
    round: int
    policy_version: int
    invocation_id: str
    credentials: FunctionCredentials
    redis_url: str | None = None  # None: the function's NITRO_REDIS_URL

    def __post_init__(self) -> None:
        if not is_job_id(self.job_id):
            raise _fail("job_id", JOB_ID_RULE, self.job_id)
        _int("round", self.round)
        _int("policy_version", self.policy_version)
        _str("invocation_id", self.invocation_id)
        if not isinstance(self.credentials, FunctionCredentials):
            try:  # names the field, never its value
                creds = FunctionCredentials.from_event({CREDENTIALS_FIELD: self.credentials}, self.job_id)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            object.__setattr__(self, CREDENTIALS_FIELD, creds)
        if self.redis_url is not None and not isinstance(self.redis_url, str):
            raise _fail("redis_url", "a string (or absent: the function's NITRO_REDIS_URL)", self.redis_url)
        self._check()

    def _check(self) -> None:
        """The kind's own fields."""

    @classmethod
    def from_dict(cls, event: object):
        """The event a function received; ConfigError naming the first field that is missing, unknown or bad."""
        return cls(**_parse(cls, event))

    def to_dict(self) -> dict:
        """The JSON payload: the required fields, and optional ones where they differ from their default (the
        consumer applies the same default)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if f.name == CREDENTIALS_FIELD:
                out[f.name] = value.to_event()
            elif required or value != _default(f):
                out[f.name] = dict(value) if isinstance(value, dict) else value
        return out


@dataclass(frozen=True, kw_only=True)
class ActorEvent(_Event):
    """An actor invocation (actor_fn/handler.py): sample `num_steps` steps with policy `policy_version` on
    `env_id` and push the batch to the job's trajectory stream, signed with the invocation's key."""

    env_id: str
    num_steps: int
    seed: int
    env_kwargs: dict = field(default_factory=dict)
    compress: bool | None = None  # None: on for image (uint8) observations such as Atari frames, off otherwise
    max_entry_bytes: int | None = None  # None: the function's NITRO_MAX_ENTRY_BYTES, else 32 MiB
    reset_episodes: bool = False  # fresh episodes from `seed`: the batch depends on the event only
    envs_per_actor: int = 1  # environments stepped in lockstep; num_steps stays the total over all of them

    def _check(self) -> None:
        _str("env_id", self.env_id)
        _int("num_steps", self.num_steps, 1, MAX_STEPS)
        _int("seed", self.seed)
        if self.env_kwargs is None:  # JSON null: no keyword arguments
            object.__setattr__(self, "env_kwargs", {})
        if not isinstance(self.env_kwargs, dict):
            raise _fail("env_kwargs", "an object", self.env_kwargs)
        if self.compress is not None and not isinstance(self.compress, bool):
            raise _fail("compress", "true, false or absent", self.compress)
        if self.max_entry_bytes is not None:
            _int("max_entry_bytes", self.max_entry_bytes, 1, MAX_ENTRY_BYTES_LIMIT)
        if not isinstance(self.reset_episodes, bool):
            raise _fail("reset_episodes", "true or false", self.reset_episodes)
        top = min(MAX_ENVS_PER_ACTOR, self.num_steps)
        if isinstance(self.envs_per_actor, bool) or not isinstance(self.envs_per_actor, int) \
                or not 1 <= self.envs_per_actor <= top:
            raise _fail("envs_per_actor", f"an integer in [1, {top}] (at most {MAX_ENVS_PER_ACTOR} and at most "
                        "num_steps)", self.envs_per_actor)


@dataclass(frozen=True, kw_only=True)
class LearnerEvent(_Event):
    """A Stellaris learner-function invocation (actor_fn/learner_handler.py): compute an update at base version
    `policy_version` from the signed parcel the parameter service parked at `payload_ref` (the parcel carries
    everything the update depends on, under one HMAC)."""

    payload_ref: str

    def _check(self) -> None:
        _str("payload_ref", self.payload_ref)
        if not is_learn_key(self.job_id, self.payload_ref):
            raise ConfigError(f"event field 'payload_ref' must name a key under {learn_prefix(self.job_id)}")


@dataclass(frozen=True, kw_only=True)
class EvalEvent(_Event):
    """An evaluation-function invocation (the actor function, actor_fn/handler.py evaluation_handler): `episodes` deterministic
    episodes of policy `policy_version` on `env_id`, episode j on seed `seed + j`, answered with their returns
    (nothing is written to Redis). `kind` is always "eval": the actor function tells the two events apart by it."""

    kind: str
    env_id: str
    episodes: int
    seed: int
    env_kwargs: dict = field(default_factory=dict)

    def _check(self) -> None:
        if self.kind != EVAL_KIND:
            raise _fail("kind", repr(EVAL_KIND), self.kind)
        _str("env_id", self.env_id)
        _int("episodes", self.episodes, 1, MAX_EVAL_EPISODES)
        _int("seed", self.seed)
        if self.env_kwargs is None:
            object.__setattr__(self, "env_kwargs", {})
        if not isinstance(self.env_kwargs, dict):
            raise _fail("env_kwargs", "an object", self.env_kwargs)


def is_eval_event(event: object) -> bool:
    """Whether the actor function got an evaluation (EvalEvent) rather than a sampling event (ActorEvent)."""
    return isinstance(event, dict) and event.get("kind") == EVAL_KIND


EVENT_TYPES = {"actor": ActorEvent, "learner": LearnerEvent, "eval": EvalEvent}  # by nitro.contracts.FUNCTION_KINDS
