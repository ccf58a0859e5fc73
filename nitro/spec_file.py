"""Training specs as files: `nitro train --config spec.yaml` (YAML or JSON).

A spec file holds the dict NitroClient.start_training takes: keys are
TrainingSpec field names; "scaler" is a dict of scaler settings or a policy
string ("nitro", "fixed:16"); "stellaris" a dict; "hyperparameters" a dict of
numeric overrides; "hidden_sizes" a list of widths; "env_kwargs" a dict. An
unknown key fails at any level, naming the key and the closest allowed ones
("did you mean 'budget_usd'?"), or all of them when none is close. Fields
the file leaves out take the server's defaults; flags given with the file
override it (`merge`). A relative scaler.scheduler path is relative to the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from nitro.spec import InvalidSpec, ScalerSettings, StellarisSettings, TrainingSpec, parse_policy

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSpec))
NESTED_FIELDS = {"scaler": tuple(f.name for f in dataclasses.fields(ScalerSettings)),
                 "stellaris": tuple(f.name for f in dataclasses.fields(StellarisSettings))}
# Dicts merged key by key when flags override a file (the rest are replaced whole).
MERGED_GROUPS = ("scaler", "stellaris", "hyperparameters", "env_kwargs")


class SpecFileError(InvalidSpec):
    """The file cannot be read or parsed, or is not a mapping (INVALID_ARGUMENT, field "config")."""

    def __init__(self, path, message: str):
        super().__init__("config", f"{path}: {message}")


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys and reads 3e-4 as a float (YAML 1.1 wants 3.0e-4)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


def load(path: str | os.PathLike) -> dict:
    """The spec in a YAML or JSON file (".json": JSON, otherwise YAML, which also reads JSON), checked
    for unknown keys and normalised: a "scaler" string becomes {"policy": ...} (and fixed_actors)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecFileError(path, f"cannot read it: {exc}") from None
    try:
        doc = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=_StrictLoader)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise SpecFileError(path, f"is not valid {kind}: {_one_line(exc)}") from None
    if not isinstance(doc, Mapping):
        raise SpecFileError(path, f"must hold a mapping of spec fields, e.g. 'env_id: CartPole-v1', got "
                                  f"{type(doc).__name__}")
    doc = normalise(dict(doc))
    check_keys(doc, where=f" in {path}")
    scheduler = doc.get("scaler", {}).get("scheduler")
    if isinstance(scheduler, str) and scheduler:  # the services resolve paths against their own directory
        doc["scaler"]["scheduler"] = str((path.parent / os.path.expanduser(scheduler)).resolve())
    return doc


def _one_line(exc: Exception) -> str:
    """A parser's error as one line (PyYAML's quote the offending line beneath)."""
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def normalise(spec: dict) -> dict:
    """A "scaler" policy string ("fixed:16") as the dict it stands for, so flags can merge into it."""
    scaler = spec.get("scaler")
    if isinstance(scaler, str):
        policy, count = parse_policy(scaler, "scaler")
        spec["scaler"] = {"policy": policy} if count is None else {"policy": policy, "fixed_actors": count}
    return spec


def check_keys(spec: Mapping, where: str = "") -> None:
    """InvalidSpec naming the first unknown key at any level (top, scaler, stellaris, hyperparameters)."""
    _known(spec, SPEC_FIELDS, "", where)
    for group, fields in NESTED_FIELDS.items():
        value = spec.get(group)
        if value is None or (group == "scaler" and isinstance(value, str)):
            continue
        if not isinstance(value, Mapping):
            raise InvalidSpec(group, f"must be a mapping of {group} settings{where}, got {value!r}")
        _known(value, fields, f"{group}.", where)
    hp = spec.get("hyperparameters")
    if hp is not None:
        if not isinstance(hp, Mapping):
            raise InvalidSpec("hyperparameters", f"must be a mapping of numeric overrides{where}, e.g. "
                                                 f"{{lr: 3.0e-4}}, got {hp!r}")
        for name in ("hidden_sizes", "activation", "vtrace_critic"):
            if name in hp:
                raise InvalidSpec(f"hyperparameters.{name}", f"is a spec field of its own{where}: set '{name}' at "
                                                             f"the top level (--{name.replace('_', '-')} as a flag)")
        _known(hp, numeric_hyperparameters(_algo_of(spec)), "hyperparameters.", where)
    kwargs = spec.get("env_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidSpec("env_kwargs", f"must be a mapping of keyword arguments{where}, got {kwargs!r}")


def _known(mapping: Mapping, allowed, prefix: str, where: str) -> None:
    unknown = sorted((k for k in mapping if k not in allowed), key=str)
    if unknown:
        close = close_keys(unknown[0], allowed)
        if close:
            raise InvalidSpec(f"{prefix}{unknown[0]}", f"unknown key{where}; did you mean "
                                                       f"{' or '.join(repr(k) for k in close)}?")
        raise InvalidSpec(f"{prefix}{unknown[0]}", f"unknown key{where}; allowed: {sorted(allowed)}")


def close_keys(key, allowed, n: int = 3) -> list[str]:
    """The allowed keys closest to a misspelt one (difflib), best first: 'budget' -> budget_usd, budget_clock.
    A flag's spelling counts as its key's ('steps-per-actor' is steps_per_actor)."""
    spelled = str(key).strip().lower().replace("-", "_")
    if spelled in allowed:
        return [spelled]
    return difflib.get_close_matches(spelled, [str(a) for a in allowed], n=n, cutoff=0.6)


def _algo_of(spec: Mapping) -> str:
    from nitro.presets import ENV_PRESETS

    name = spec.get("preset")
    preset = ENV_PRESETS.get(name) if isinstance(name, str) else None
    algo = spec.get("algo") or (preset.algo if preset else "ppo")
    return algo if algo in ("ppo", "impact") else "ppo"  # a wrong algo is the server's to name


def numeric_hyperparameters(algo: str) -> tuple[str, ...]:
    """The config fields of `algo` the hyperparameters map can carry (hidden_sizes, activation and vtrace_critic
    are spec fields of their own; value_clip_mode comes with a preset)."""
    from nitro.config import CONFIG_CLASSES

    return tuple(f.name for f in dataclasses.fields(CONFIG_CLASSES[algo]) if f.type in ("int", "float", "bool"))


def merge(base: Mapping, override: Mapping) -> dict:
    """`override` laid over `base`: nested settings (scaler, stellaris, hyperparameters, env_kwargs)
    merge key by key, everything else is replaced."""
    out = {k: dict(v) if k in MERGED_GROUPS and isinstance(v, Mapping) else v for k, v in base.items()}
    for key, value in normalise(dict(override)).items():
        if key in MERGED_GROUPS and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
