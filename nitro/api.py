"""`nitro.train`: one call that runs a training job to its end and hands back what it produced.

    import nitro

    run = nitro.train(env_id="CartPole-v1", rounds=5, scaler="fixed:4")
    print(run.final_state, run.reports[-1].eval_return, run.results_dir)
    policy = run.best_policy()            # a TrainedPolicy: predict(), save(), observation_space, action_space

It is `nitro train` as a function: the same local system (the one `nitro up` runs in the state dir, else one
started for the job and stopped after it), the same progress output and the same files in results/<job>/
(nitro.client.commands.follow does both), and the same spec: a dict with TrainingSpec's field names, a
TrainingSpec, a spec file (YAML or JSON, as `--config`), and keyword fields laid over any of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nitro.errors import LocalSystemError, NitroError, PolicyError
from nitro.spec import InvalidSpec, TrainingSpec

if TYPE_CHECKING:
    from nitro.client.sdk import RoundReport, TrainingStatus
    from nitro.policy.trained import TrainedPolicy

SpecLike = TrainingSpec | Mapping[str, Any] | str | os.PathLike[str]

REATTACH_TIMEOUT_S = 300.0  # as `nitro train --reattach-timeout`


@dataclasses.dataclass(frozen=True, repr=False)
class TrainingRun:
    """A job `nitro.train` followed to its end: its final status, every round's report, and the directory its
    results were written to (rounds.csv, summary.json, training.png, checkpoint.pt, best.pt)."""

    job_id: str
    status: TrainingStatus  # the job's final TrainingStatus (fields as in training.proto)
    reports: list[RoundReport]  # one RoundReport per round, in order
    results_dir: Path

    @property
    def final_state(self) -> str:
        """"SUCCEEDED", "FAILED" or "STOPPED" (a job stops early on its budget or target return too)."""
        return self.status.state_name

    @property
    def succeeded(self) -> bool:
        return self.final_state == "SUCCEEDED"

    @property
    def message(self) -> str:
        """The learner's last word on the job (why it ended)."""
        return str(self.status.message)

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: returns, costs on both clocks, wall time, checkpoint paths, the spec."""
        return dict(json.loads((self.results_dir / "summary.json").read_text()))

    def best_policy(self, seed: int | None = None) -> TrainedPolicy:
        """The policy of the round with the best evaluation (results_dir/best.pt); `seed` seeds sampling."""
        return self._policy("best.pt", "the best round's", seed)

    def final_policy(self, seed: int | None = None) -> TrainedPolicy:
        """The policy after the last round (results_dir/checkpoint.pt)."""
        return self._policy("checkpoint.pt", "the last round's", seed)

    def _policy(self, name: str, which: str, seed: int | None) -> TrainedPolicy:
        from nitro.policy.trained import load_policy

        path = self.results_dir / name
        if not path.exists():
            where = self.status.checkpoint_path
            raise PolicyError(f"{path}: no such file: {which} checkpoint was not copied into the results (job "
                              f"{self.job_id} {self.final_state}; the learner's checkpoint: {where or 'none'}; "
                              f"one on another machine must be fetched from there)")
        return load_policy(path, seed=seed)

    def __repr__(self) -> str:
        return (f"TrainingRun(job_id={self.job_id!r}, final_state={self.final_state!r}, rounds={len(self.reports)}, "
                f"results_dir={str(self.results_dir)!r})")


class TrainingNotFinished(NitroError, RuntimeError):
    """Following the job stopped before it ended (its learner or the local system went away); `.run` holds
    what arrived, and the message how to go on with the job (it keeps its checkpoint)."""

    def __init__(self, message: str, run: TrainingRun):
        self.run = run
        super().__init__(message)


_OPTIONS = ("local", "target", "token_file", "state_dir", "results_dir", "progress", "reattach_timeout_s",
            "tensorboard", "wandb_project")  # keyword arguments of `train` that are not spec fields


def train(spec: SpecLike | None = None, /, *, local: bool = True, target: str | None = None,
          token_file: str | os.PathLike[str] | None = None, state_dir: str | os.PathLike[str] | None = None,
          results_dir: str | os.PathLike[str] = "results", progress: bool = True,
          reattach_timeout_s: float = REATTACH_TIMEOUT_S, tensorboard: str | None = None,
          wandb_project: str | None = None, **fields: Any) -> TrainingRun:
    """Run one training job to its end and return its TrainingRun.

    The job: `spec` (a dict with TrainingSpec's field names, a nitro.TrainingSpec, or the path of a spec
    file) with `fields` laid over it (`env_id="CartPole-v1", rounds=5, scaler="fixed:4", hyperparameters=
    {"lr": 3e-4}`; nested settings merge key by key, as flags over `--config`). Fields not given take the
    learner's defaults. A bad field raises nitro.spec.InvalidSpec naming it.

    Where it runs: `local` (default) uses the local system up in `state_dir` (default $NITRO_STATE_DIR, else
    .nitro: where `nitro up` runs it), or starts one there for the job and stops it afterwards, saying which.
    Starting one takes a while: `nitro up` once keeps it across calls. `target` ("host:port") trains on that
    learner instead; `local=False` without a target uses $NITRO_TARGET, else the system up in `state_dir`.
    The token is found as NitroClient finds it; `token_file` names one.

    It prints what `nitro train` prints (a progress bar on a terminal, else a line per round, then the
    summary); `progress=False` prints only the local system's lines. Results go to results_dir/<job>/, and
    `tensorboard` (a directory) or `wandb_project` log every round there too.

    A job that FAILED or was STOPPED is returned like one that SUCCEEDED (see `final_state`, `message`).
    Ctrl-C stops the job, writes what arrived, and raises KeyboardInterrupt. TrainingNotFinished when the
    learner went away before the job ended; server errors raise nitro.client.sdk.NitroRpcError subclasses.
    Call it from the main thread when it may start a local system.
    """
    from nitro.client.commands.follow import FollowOptions, open_job_trackers, start_and_follow
    from nitro.client.sdk import NitroClient, find_target
    from nitro.local import system_state

    job_spec = _job_spec(spec, fields)
    state_dir = os.fspath(state_dir) if state_dir is not None else system_state.default_state_dir()
    local = local and not target
    if local and system_state.running_state(state_dir) is None:
        _check(job_spec)  # bad input costs a second, not a system start (a running system's learner decides)
    opts = FollowOptions(state_dir=state_dir, target=target, results_dir=os.fspath(results_dir),
                         no_progress=not progress, tensorboard=tensorboard, wandb_project=wandb_project,
                         reattach_timeout_s=reattach_timeout_s, local=local)
    trackers = open_job_trackers(opts)
    with contextlib.ExitStack() as stack:
        if local:
            from nitro.client.commands.system import LocalSystemOptions, local_system_for_job

            learner = stack.enter_context(local_system_for_job(LocalSystemOptions(state_dir)))
        else:
            learner = find_target(target, state_dir) or _not_up(state_dir)
        client = stack.enter_context(NitroClient(learner, token_file=token_file, state_dir=state_dir))
        with _quiet(not progress):
            followed = start_and_follow(client, job_spec, opts, trackers)
    status = followed.status
    run = TrainingRun(str(status.job_id), status, list(followed.reports), Path(followed.results_dir))
    if followed.interrupted:
        raise KeyboardInterrupt
    if followed.unfinished:
        raise TrainingNotFinished(followed.unfinished, run)
    return run


def _job_spec(spec: SpecLike | None, fields: Mapping[str, Any]) -> dict[str, Any] | TrainingSpec:
    """The spec `start_training` is given: a TrainingSpec (every field sent) or a dict (only its keys sent)."""
    from nitro import spec_file
    from nitro.presets import is_env_preset

    if isinstance(spec, str | os.PathLike):
        if not Path(spec).is_file():
            raise InvalidSpec("spec", f"{os.fspath(spec)!r} is no spec file; an environment is a field: "
                                      f"nitro.train(env_id={os.fspath(spec)!r}, ...)")
        spec = spec_file.load(spec)
    if isinstance(spec, TrainingSpec):
        return _replace(spec, fields) if fields else spec
    if spec is not None and not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a dict, a nitro.TrainingSpec or a spec file's path, not {type(spec).__name__}")
    clashes = sorted(set(fields) & set(_OPTIONS))
    if clashes:  # cannot happen through keywords; a dict unpacked into them could
        raise TypeError(f"{clashes[0]} is an option of nitro.train, not a spec field")
    merged = spec_file.merge(spec_file.normalise(dict(spec or {})), fields)
    spec_file.check_keys(merged)  # unknown keys at every level, hyperparameter names of the algorithm
    if not merged.get("env_id") and not is_env_preset(merged.get("preset", "")):
        raise InvalidSpec("env_id", "is required, e.g. nitro.train(env_id='CartPole-v1'), or an environment "
                                    "preset such as preset='hopper-ppo'")
    return merged


def _replace(spec: TrainingSpec, fields: Mapping[str, Any]) -> TrainingSpec:
    """`spec` with `fields` set; nested settings (scaler, stellaris) may be given as dicts of their fields."""
    allowed = {f.name for f in dataclasses.fields(TrainingSpec)}
    changes: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in allowed:
            raise InvalidSpec(name, f"unknown field; allowed: {sorted(allowed)}")
        if (name == "scaler" and isinstance(value, str)) or (name in ("scaler", "stellaris")
                                                             and isinstance(value, Mapping)):
            from nitro import spec_file

            nested = dict(spec_file.normalise({name: value})[name])  # "fixed:16" as the dict it stands for
            current = getattr(spec, name)
            known = {f.name for f in dataclasses.fields(current)}
            unknown = sorted(set(nested) - known)
            if unknown:
                raise InvalidSpec(f"{name}.{unknown[0]}", f"unknown field; allowed: {sorted(known)}")
            value = dataclasses.replace(current, **nested)
        changes[name] = value
    return dataclasses.replace(spec, **changes)


def _check(spec: dict[str, Any] | TrainingSpec) -> None:
    """The learner's own validation (nitro.spec.validate), here: InvalidSpec names the field."""
    from nitro.client.sdk import spec_to_proto
    from nitro.spec import from_proto, validate

    validate(from_proto(spec_to_proto(spec)))


def _not_up(state_dir: str) -> str:
    raise LocalSystemError(f"no learner to train on: nothing is up in {state_dir} and $NITRO_TARGET is not set; "
                           f"run `nitro up`, or call nitro.train with local=True or target='host:port'")


@contextlib.contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """Standard output to /dev/null inside the block when `quiet`."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield
