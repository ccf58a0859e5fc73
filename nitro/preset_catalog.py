"""`nitro presets`: one line per algorithm preset and per environment preset, saying what it sets."""

from __future__ import annotations

import dataclasses

from nitro.config import ALGO_PRESET_NOTES, ALGO_PRESETS, CONFIG_CLASSES
from nitro.presets import ENV_PRESETS


def _value(v) -> str:
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def algo_preset_settings(algo: str, name: str) -> dict:
    """The fields preset `name` of `algo` sets to something other than the config class's default."""
    preset, default = ALGO_PRESETS[algo][name], CONFIG_CLASSES[algo]()
    return {f.name: getattr(preset, f.name) for f in dataclasses.fields(preset)
            if getattr(preset, f.name) != getattr(default, f.name)}


def env_preset_settings(name: str) -> dict:
    """The spec fields environment preset `name` fills in."""
    p = ENV_PRESETS[name]
    return {"env_id": p.env_id, "algo": p.algo, "preset": p.algo_preset, "steps_per_actor": p.steps_per_actor,
            "scaler.i_min": p.i_min, "scaler.i_max": p.i_max, "eval_episodes": p.eval_episodes,
            **{f"hyperparameters.{k}": v for k, v in p.hyperparameters.items()}}


def lines() -> list[str]:
    out = ["algorithm presets (--algo ALGO --preset NAME): purpose; fields set other than the algorithm's defaults"]
    for algo, presets in ALGO_PRESETS.items():
        for name in sorted(presets):
            changed = " ".join(f"{k}={_value(v)}" for k, v in algo_preset_settings(algo, name).items())
            changed = changed or "(exactly the algorithm's defaults)"
            out.append(f"  {algo:<7} {name:<12} {ALGO_PRESET_NOTES[algo][name]}: {changed}")
    out += ["", "environment presets (--preset NAME, no --env needed): spec fields set; the spec's own values win"]
    width = max(map(len, ENV_PRESETS))
    for name in sorted(ENV_PRESETS):
        out.append(f"  {name:<{width}}  " + " ".join(f"{k}={_value(v)}" for k, v in env_preset_settings(name).items()))
    return out
