"""`nitro eval`, `nitro export`: a trained policy out of a checkpoint or an export."""

from __future__ import annotations

import json
import sys

from nitro.client.commands.common import CliError, at_least


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="run deterministic episodes with a trained policy: mean, IQM and a 95%% CI",
                       description="Load a checkpoint (checkpoint.pt, best.pt) or an export directory and run "
                                   "deterministic episodes, episode i on seed S+i, as the learner evaluates. "
                                   "Prints the mean return and the interquartile mean with a 95% bootstrap CI "
                                   "(none for a single episode); "
                                   "exit code 2 for a missing or unreadable policy, an environment whose spaces "
                                   "do not fit it, or bad flags.")
    p.add_argument("policy", metavar="CHECKPOINT", help="checkpoint.pt, best.pt, or a directory from `nitro export`")
    p.add_argument("--env", default="", metavar="ID",
                   help="Gymnasium id (default: the environment the policy was trained on)")
    p.add_argument("--episodes", type=at_least(1), default=10, metavar="N", help="episodes (default: %(default)s)")
    p.add_argument("--seed", type=at_least(0), default=0, metavar="S",
                   help="episode i runs on seed S+i (default: %(default)s)")
    p.add_argument("--video", default=None, metavar="PATH",
                   help="record the first episode to PATH, .mp4 or .gif (rgb_array frames)")
    p.add_argument("--vs-random", action="store_true",
                   help="also run a uniformly random policy on the same episodes and compare")
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="a measured return to compare with (JSON: label, env_id, env_steps, returns; "
                        "bench/sb3_reference.py writes one)")
    p.add_argument("--summary", default=None, metavar="PATH",
                   help="also write what was printed to PATH (markdown), with the training's costs when the "
                        "policy sits in a results directory beside its summary.json")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout (the readable lines go to stderr)")
    p.set_defaults(func=cmd_eval)


def _policy_line(path: str, info: dict) -> str:
    known = [f"{info['env_id']} ({info.get('algo') or '?'})" if info.get("env_id") else ""]
    known += [f"{name} {info[key]}" for key, name in (("round", "round"), ("version", "policy version"))
              if info.get(key) is not None]
    return f"{path}: " + ", ".join(k for k in known if k)


def cmd_eval(args) -> int:
    from nitro.errors import NitroError
    from nitro.policy.evaluation import comparison_lines, evaluate_policy, load_reference, random_returns
    from nitro.policy.trained import load_policy

    out = sys.stderr if args.json else sys.stdout
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, file=out, flush=True)

    try:
        reference = load_reference(args.reference) if args.reference else None
        summary_path = _writable(args.summary) if args.summary else None
        policy = load_policy(args.policy)
        say(f"policy    {_policy_line(args.policy, policy.info)}")
        result = evaluate_policy(policy, args.env, args.episodes, args.seed, args.video)
        env_kwargs = dict(policy.info.get("env_kwargs") or {}) if result.env_id == policy.env_id else {}
        random = random_returns(result.env_id, args.episodes, args.seed, env_kwargs) if args.vs_random else None
    except NitroError as exc:  # PolicyError, ConfigError, UnknownEnvironmentError: all bad input
        raise CliError(str(exc), exit_code=2) from None
    except OSError as exc:  # e.g. a video path that cannot be written
        raise CliError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), exit_code=2) from None
    doc = {"policy": args.policy, "policy_info": policy.info, **result.to_dict()}
    last = f"{result.seed}..{result.seed + len(result.returns) - 1}" if len(result.returns) > 1 else str(result.seed)
    say(f"episodes  {len(result.returns)} on {result.env_id}, seeds {last}, deterministic")
    say(f"return    mean {doc['mean']:.2f} (std {doc['std']:.2f}, min {doc['min']:.2f}, max {doc['max']:.2f})")
    if result.iqm_ci95 is None:  # one episode: no interval to give
        say(f"IQM       {result.iqm:.2f} ({result.ci_method})")
    else:
        low, high = result.iqm_ci95
        say(f"IQM       {result.iqm:.2f}, 95% CI [{low:.2f}, {high:.2f}] ({result.ci_method})")
    if result.video:
        say(f"video     {result.video}: episode 0 (seed {result.seed}), {result.video_frames} frames")
    training = _training_summary(args.policy) if args.summary else None
    for line in comparison_lines(result, random, reference, training):
        say(line)
    if random is not None:
        doc["random_returns"] = random
    if summary_path:
        summary_path.write_text(f"# Evaluation of {args.policy}\n\n```\n" + "\n".join(lines) + "\n```\n",
                                encoding="utf-8")
        print(f"summary   {summary_path}", file=out)
    if args.json:
        print(json.dumps(doc))
    return 0


def _writable(path: str):
    from pathlib import Path

    p = Path(path)
    if not p.parent.is_dir():
        raise CliError(f"--summary {path}: directory {p.parent} does not exist", exit_code=2)
    return p


def _training_summary(policy_path: str) -> dict | None:
    """The summary.json of the results directory a checkpoint was copied into (results/<job>/best.pt), if any."""
    from pathlib import Path

    here = Path(policy_path)
    found = (here if here.is_dir() else here.parent) / "summary.json"
    try:
        doc = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    needed = ("cloud_total_cost_usd", "cloud_seconds", "total_cost_usd", "wall_s")
    return doc if isinstance(doc, dict) and all(isinstance(doc.get(k), (int, float)) for k in needed) else None


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a trained policy as weights + JSON, loadable without nitro's services",
                       description="Write policy.json (model spec, observation normalisation, source) and the "
                                   "weights (safetensors when installed, else numpy .npz) into DIR; "
                                   "nitro.load_policy(DIR) and `nitro eval DIR` read it back.")
    p.add_argument("policy", metavar="CHECKPOINT", help="checkpoint.pt, best.pt, or a directory from `nitro export`")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from nitro.errors import PolicyError
    from nitro.policy.trained import export_policy, load_policy

    try:
        policy = load_policy(args.policy)
        path = export_policy(policy, args.out)
    except PolicyError as exc:
        raise CliError(str(exc), exit_code=2) from None
    except OSError as exc:
        raise CliError(f"--out {args.out}: {exc.strerror or exc}", exit_code=2) from None
    weights = json.loads(path.read_text())["weights"]
    print(f"exported {_policy_line(args.policy, policy.info)}")
    print(f"  to      {path.parent}/ ({path.name}, {weights})")
    print(f"  use     nitro.load_policy({str(path.parent)!r}) or nitro eval {path.parent}")
    return 0
