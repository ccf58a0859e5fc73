"""A job's environment keyword arguments: their checks and their wire form.

`TrainingSpec.env_kwargs` is a dict handed to every environment the job builds
(the learner's spaces and evaluation, every actor) as `gym.make(env_id, **kwargs)`,
e.g. {"max_episode_steps": 200} or {"sutton_barto_reward": true}. On the wire
it travels as a JSON object (TrainingSpec/LaunchRequest `env_kwargs_json`): JSON
keeps ints, bools, strings and lists apart, as environment constructors expect.

The checks here are structural (names, JSON values, size); whether the
environment accepts them is found out by building it (nitro.spec.validate).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from nitro.errors import ConfigError

FIELD = "env_kwargs"
MAX_KWARGS = 32
MAX_JSON_BYTES = 4096
MAX_DEPTH = 4  # {"a": [[1]]} is depth 3
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The services decide these: the learner renders only for videos, and nothing opens a window on a server.
RESERVED = ("render_mode",)


class EnvKwargsError(ConfigError):
    """A malformed env_kwargs; `.detail` says what is wrong (without the field name)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(f"{FIELD}: {detail}")


def check(kwargs) -> dict:
    """`kwargs` as a plain dict after the structural checks; EnvKwargsError otherwise."""
    if not isinstance(kwargs, Mapping):
        raise EnvKwargsError(f"must be a mapping of keyword names to JSON values, got {type(kwargs).__name__}")
    if len(kwargs) > MAX_KWARGS:
        raise EnvKwargsError(f"at most {MAX_KWARGS} keyword arguments, got {len(kwargs)}")
    for name, value in kwargs.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise EnvKwargsError(f"keyword {name!r} must be a Python identifier of at most 64 characters")
        if name in RESERVED:
            raise EnvKwargsError(f"keyword {name!r} is set by the services, not by a spec; reserved: {list(RESERVED)}")
        _check_value(name, value, 1)
    text = _dumps(kwargs)
    if len(text.encode()) > MAX_JSON_BYTES:
        raise EnvKwargsError(f"at most {MAX_JSON_BYTES} bytes as JSON, got {len(text.encode())}")
    return json.loads(text)  # a copy of plain JSON types (tuples become lists)


def _check_value(path: str, value, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise EnvKwargsError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise EnvKwargsError(f"{path}: numbers must be finite, got {value!r}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(f"{path}[{i}]", item, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise EnvKwargsError(f"{path}: object keys must be strings, got {key!r}")
            _check_value(f"{path}.{key}", item, depth + 1)
        return
    raise EnvKwargsError(f"{path}: allowed values are JSON ones (null, bool, number, string, list, object), "
                         f"got {type(value).__name__}")


def _dumps(kwargs) -> str:
    return json.dumps(kwargs, sort_keys=True, separators=(",", ":"), allow_nan=False)


def to_json(kwargs) -> str:
    """The wire form: "" for none, else a compact JSON object (checked first)."""
    checked = check(kwargs)
    return _dumps(checked) if checked else ""


def from_json(text: str) -> dict:
    """Wire form -> checked dict ({} for ""); EnvKwargsError for anything but a valid JSON object."""
    if not text:
        return {}
    if len(text.encode()) > MAX_JSON_BYTES:
        raise EnvKwargsError(f"at most {MAX_JSON_BYTES} bytes as JSON, got {len(text.encode())}")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise EnvKwargsError(f"is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise EnvKwargsError(f"must be a JSON object, got {type(value).__name__}")
    return check(value)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")
