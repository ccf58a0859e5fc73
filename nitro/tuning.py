"""`nitro tune`'s study file: the base spec, the search space, the pruner and the sampler, read and checked here
(pure: no Optuna until `make_study`), and what a trial's parameters make of the base spec.

A study file is YAML (or JSON):

    spec:                          # the base spec, as a --config file holds it (or give --config FILE)
      env_id: CartPole-v1
      preset: fast
      rounds: 12
    space:                         # a parameter per spec field it sets: NAME or GROUP.NAME
      hyperparameters.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      steps_per_actor:    {type: int, low: 128, high: 512, step: 128}
      scaler:             {type: categorical, choices: ["fixed:2", "fixed:4"]}
    pruner: {type: successive_halving, min_resource: 2, reduction_factor: 2}   # or median, none
    sampler: {seed: 0, n_startup_trials: 5}                                    # TPE
    enqueue:                       # trials to run first, e.g. the preset's values (any subset of the space)
      - {hyperparameters.lr: 3.0e-4}

Every error names the field (`space.hyperparameters.lr.low`) and what is allowed. The tuner owns a trial's
job_id, budget_usd and budget_clock, so the space cannot set them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nitro.spec import InvalidSpec

TOP_KEYS = ("spec", "space", "pruner", "sampler", "enqueue")
PARAM_TYPES = ("float", "int", "categorical")
PARAM_KEYS = {"float": ("type", "low", "high", "log", "step"), "int": ("type", "low", "high", "log", "step"),
              "categorical": ("type", "choices")}
PRUNERS = {"successive_halving": ("type", "min_resource", "reduction_factor"),
           "median": ("type", "n_startup_trials", "n_warmup_steps"),
           "none": ("type",)}
SAMPLER_KEYS = ("seed", "n_startup_trials")
GROUPS = ("scaler", "stellaris", "hyperparameters", "env_kwargs")  # GROUP.NAME parameters
# Mappings, tuned a setting at a time (GROUP.NAME); "scaler" also takes a whole policy string ("fixed:4").
WHOLE_GROUPS = ("stellaris", "hyperparameters", "env_kwargs")
TUNER_OWNS = ("job_id", "budget_usd", "budget_clock")  # set per trial by the tuner


class StudyFileError(InvalidSpec):
    """A bad study file: `field` is the key path inside it, the message says what is allowed."""

    def __init__(self, path: str | os.PathLike, field_name: str, message: str):
        super().__init__(field_name, f"{message} (in {os.fspath(path)})")


@dataclass(frozen=True)
class Param:
    name: str  # a spec path: "steps_per_actor", "hyperparameters.lr", "scaler.policy"
    kind: str  # float, int, categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def extremes(self) -> list:
        """The values that bound the range (every choice of a categorical one): what `check` tries."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass(frozen=True)
class StudyFile:
    base: dict  # the base spec (normalised as a spec file)
    space: tuple[Param, ...]
    pruner: dict = field(default_factory=lambda: {"type": "successive_halving"})
    sampler: dict = field(default_factory=dict)
    enqueue: tuple[dict, ...] = ()


def _number(path, where: str, value: Any, integer: bool) -> float | int:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        raise StudyFileError(path, where, f"must be {'an integer' if integer else 'a finite number'}, got {value!r}")
    return value


def _unknown(path, where: str, keys, allowed) -> None:
    extra = [k for k in keys if k not in allowed]
    if extra:
        raise StudyFileError(path, f"{where}.{extra[0]}" if where else str(extra[0]),
                             f"unknown key; allowed: {', '.join(allowed)}")


def check_name(path, name: Any) -> str:
    """A parameter's name: a spec field (not one the tuner owns) or GROUP.NAME of a settings group."""
    from nitro.spec_file import NESTED_FIELDS, SPEC_FIELDS

    where = f"space.{name}"
    if not isinstance(name, str) or not name:
        raise StudyFileError(path, "space", f"parameter names are spec fields, e.g. steps_per_actor or "
                                            f"hyperparameters.lr, got {name!r}")
    group, dot, leaf = name.partition(".")
    if not dot:
        if name in TUNER_OWNS:
            raise StudyFileError(path, where, "is set for each trial by the tuner (--trial-budget, the trial's "
                                              "id); tunable are the other spec fields")
        if name not in SPEC_FIELDS or name in WHOLE_GROUPS:
            allowed = [f for f in SPEC_FIELDS if f not in TUNER_OWNS and f not in WHOLE_GROUPS]
            raise StudyFileError(path, where, f"unknown spec field; allowed: {', '.join(allowed)}, or "
                                              f"GROUP.NAME with GROUP one of {', '.join(GROUPS)}")
        return name
    if group not in GROUPS or not leaf or "." in leaf:
        raise StudyFileError(path, where, f"a dotted name is GROUP.NAME with GROUP one of {', '.join(GROUPS)}")
    if group in NESTED_FIELDS and leaf not in NESTED_FIELDS[group]:
        raise StudyFileError(path, where, f"unknown {group} setting; allowed: {', '.join(NESTED_FIELDS[group])}")
    return name


def parse_param(path, name: str, raw: Any) -> Param:
    where = f"space.{name}"
    if not isinstance(raw, Mapping):
        raise StudyFileError(path, where, "must be a mapping such as {type: float, low: 1.0e-4, high: 1.0e-2, "
                                          "log: true} or {type: categorical, choices: [a, b]}")
    kind = raw.get("type")
    if kind not in PARAM_TYPES:
        raise StudyFileError(path, f"{where}.type", f"must be one of {', '.join(PARAM_TYPES)}, got {kind!r}")
    _unknown(path, where, raw, PARAM_KEYS[kind])
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise StudyFileError(path, f"{where}.choices", f"must be a non-empty list, got {choices!r}")
        for c in choices:
            if not (c is None or isinstance(c, bool | int | float | str)):
                raise StudyFileError(path, f"{where}.choices", f"choices are numbers, strings, booleans or null "
                                                               f"(Optuna's), got {c!r}")
        return Param(name, kind, choices=tuple(choices))
    integer = kind == "int"
    for key in ("low", "high"):
        if key not in raw:
            raise StudyFileError(path, f"{where}.{key}", "is required")
    low, high = (_number(path, f"{where}.{k}", raw[k], integer) for k in ("low", "high"))
    if not low < high:
        raise StudyFileError(path, f"{where}.low", f"must be < high ({high!r}), got {low!r}")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise StudyFileError(path, f"{where}.log", f"must be true or false, got {log!r}")
    if log and low <= 0:
        raise StudyFileError(path, f"{where}.low", f"must be > 0 with log: true, got {low!r}")
    step = raw.get("step")
    if step is not None:
        step = _number(path, f"{where}.step", step, integer)
        if step <= 0:
            raise StudyFileError(path, f"{where}.step", f"must be > 0, got {step!r}")
        if log:
            raise StudyFileError(path, f"{where}.step", "does not combine with log: true (Optuna's rule)")
    return Param(name, kind, low, high, log, step)


def _pruner(path, raw: Any) -> dict:
    if raw is None:
        return {"type": "successive_halving"}
    if not isinstance(raw, Mapping) or raw.get("type") not in PRUNERS:
        got = raw.get("type") if isinstance(raw, Mapping) else raw
        raise StudyFileError(path, "pruner.type", f"must be one of {', '.join(PRUNERS)}, got {got!r}")
    _unknown(path, "pruner", raw, PRUNERS[raw["type"]])
    for key in PRUNERS[raw["type"]][1:]:
        if key == "min_resource" and raw.get(key) == "auto":  # Optuna's: from the first trial's steps
            continue
        if key in raw:
            value = _number(path, f"pruner.{key}", raw[key], integer=True)
            low = 2 if key == "reduction_factor" else 1 if key == "min_resource" else 0
            if value < low:
                raise StudyFileError(path, f"pruner.{key}", f"must be >= {low}, got {value}")
    return dict(raw)


def _sampler(path, raw: Any) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise StudyFileError(path, "sampler", f"must be a mapping with {', '.join(SAMPLER_KEYS)}, got {raw!r}")
    _unknown(path, "sampler", raw, SAMPLER_KEYS)
    for key in SAMPLER_KEYS:
        if key in raw and _number(path, f"sampler.{key}", raw[key], integer=True) < 0:
            raise StudyFileError(path, f"sampler.{key}", f"must be >= 0, got {raw[key]}")
    return dict(raw)


def parse(doc: Any, path: str | os.PathLike = "<study>", base: Mapping | None = None) -> StudyFile:
    """A study file's document, checked; `base` (a --config spec) stands in for, or lies under, its `spec`."""
    from nitro import spec_file

    if not isinstance(doc, Mapping):
        raise StudyFileError(path, "study", f"must be a mapping with keys {', '.join(TOP_KEYS)}, got "
                                            f"{type(doc).__name__}")
    _unknown(path, "", doc, TOP_KEYS)
    raw_spec = doc.get("spec") or {}
    if not isinstance(raw_spec, Mapping):
        raise StudyFileError(path, "spec", "must be a mapping of spec fields, as a --config file holds")
    try:
        spec = spec_file.normalise(dict(raw_spec))
        spec_file.check_keys(spec, where=f" in {os.fspath(path)}, under spec")
    except InvalidSpec as exc:
        raise StudyFileError(path, f"spec.{exc.field}", exc.detail) from None
    merged = spec_file.merge(dict(base or {}), spec)
    space_raw = doc.get("space")
    if not isinstance(space_raw, Mapping) or not space_raw:
        raise StudyFileError(path, "space", "is required: a mapping of parameter name to its range, e.g. "
                                            "hyperparameters.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}")
    space = tuple(parse_param(path, check_name(path, name), raw) for name, raw in space_raw.items())
    enqueue_raw = doc.get("enqueue") or []
    if not isinstance(enqueue_raw, list):
        raise StudyFileError(path, "enqueue", "must be a list of {parameter: value} mappings")
    names = [p.name for p in space]
    for i, item in enumerate(enqueue_raw):
        if not isinstance(item, Mapping):
            raise StudyFileError(path, f"enqueue[{i}]", "must be a mapping of parameter name to value")
        _unknown(path, f"enqueue[{i}]", item, names)
    return StudyFile(merged, space, _pruner(path, doc.get("pruner")), _sampler(path, doc.get("sampler")),
                     tuple(dict(e) for e in enqueue_raw))


def load(path: str | os.PathLike, base: Mapping | None = None) -> StudyFile:
    """The study file at `path` (YAML, or JSON for .json), checked (`parse`)."""
    import json

    import yaml

    from nitro.spec_file import _StrictLoader

    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise StudyFileError(p, "study", f"cannot read it: {exc}") from None
    try:
        doc = json.loads(text) if p.suffix.lower() == ".json" else yaml.load(text, Loader=_StrictLoader)
    except (ValueError, yaml.YAMLError) as exc:
        raise StudyFileError(p, "study", f"is not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: "
                                         f"{' '.join(str(exc).split())}") from None
    return parse(doc, p, base)


def nested(params: Mapping[str, Any]) -> dict:
    """{"hyperparameters.lr": 1e-3, "rounds": 5} as spec keys: {"hyperparameters": {"lr": 1e-3}, "rounds": 5}."""
    from nitro.spec_file import normalise

    out = normalise({k: v for k, v in params.items() if "." not in k})  # "scaler": "fixed:4" as its dict first
    for name, value in params.items():
        group, dot, leaf = name.partition(".")
        if dot:
            out.setdefault(group, {})[leaf] = value
    return out


def trial_spec(base: Mapping, params: Mapping[str, Any], job_id: str | None = None,
               budget_usd: float | None = None) -> dict:
    """The base spec with a trial's parameters laid over it (nested settings merged key by key), and the
    tuner's own fields: the job id and the trial's budget on the cloud clock."""
    from nitro import spec_file

    spec = spec_file.merge(dict(base), nested(params))
    if job_id is not None:
        spec["job_id"] = job_id
    if budget_usd is not None:
        spec["budget_usd"], spec["budget_clock"] = budget_usd, "cloud"
    return spec


def check(study: StudyFile, path: str | os.PathLike = "<study>") -> None:
    """Every parameter at each end of its range (each choice), alone over the base spec and then with the others at
    their low end, is a spec the learner accepts (nitro.spec.validate): a bad range fails here, naming the
    parameter (or `space` when only a combination fails), before any job starts."""
    from nitro.client.sdk import spec_to_proto
    from nitro.spec import from_proto, validate
    from nitro.spec_file import check_keys

    lows = {p.name: p.extremes()[0] for p in study.space}
    if not study.base.get("env_id"):
        from nitro.presets import is_env_preset

        if not is_env_preset(study.base.get("preset", "")):
            raise StudyFileError(path, "spec.env_id", "is required: the base spec (spec: in the file, or --config) "
                                                      "names the environment, e.g. env_id: CartPole-v1")

    def valid(params: dict, where: str, what: str) -> None:
        try:
            spec = trial_spec(study.base, params, budget_usd=1.0)
            check_keys(spec)
            validate(from_proto(spec_to_proto(spec)))
        except InvalidSpec as exc:
            raise StudyFileError(path, where, f"{what} makes an invalid spec: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise StudyFileError(path, where, f"{what} cannot be sent: {exc}") from None

    for p in study.space:  # each alone over the base spec: a fault of its own range is named as its
        for value in p.extremes():
            valid({p.name: value}, f"space.{p.name}", repr(value))
    valid(lows, "space", f"every parameter at its low end (first choice), {lows},")  # then together
    for p in study.space:
        for value in p.extremes()[1:]:
            valid({**lows, p.name: value}, "space", f"{p.name} = {value!r} with the others at their low end")
