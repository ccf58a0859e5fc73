"""Evaluation of a published policy version: where it runs and what comes back (docs/evaluation.md).

With TrainingSpec.evaluation "functions" (the default) a round's evaluation episodes run as serverless evaluation
functions (the actor function, kind "eval" through the scaler's Launch: the same invoke path, retries and
billing as actors, in counters of their own) on the version just published, while the next round samples. With
"learner" the learner runs them itself between rounds, on its critical path and its bill. Either way episode j
runs on seed `eval_seed(...) + j` with deterministic actions, so both give the same returns for the same version.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from learner_svc.constants import EVAL_SEED_TAG
from nitro.seeds import derived_seed
from nitro.v1 import scaler_pb2


def eval_seed(seed: int, round_index: int) -> int:
    """The seed of episode 0 of round `round_index`'s evaluation (episode j: + j); never an actor's seed."""
    return derived_seed(seed, round_index, EVAL_SEED_TAG, 1) % (2**31)


@dataclass
class Evaluated:
    """One version's evaluation: the mean return of its episodes (NaN: none came back), and what it cost."""

    eval_return: float
    episodes: int = 0  # that came back
    usd: float = 0.0  # the evaluation functions' bill, this machine's clock (0 on the learner)
    cloud_usd: float = 0.0
    cloud_seconds: float = 0.0  # modelled time of the evaluation functions (the slowest one)
    notes: list[str] = field(default_factory=list)


def from_returns(returns: list[float]) -> Evaluated:
    return Evaluated(float(np.mean(returns)) if returns else math.nan, len(returns))


def from_launch(resp: scaler_pb2.LaunchResponse, episodes: int) -> Evaluated:
    """The evaluation an eval Launch answered: the mean over the episodes that came back. Functions that failed
    are named in the notes; with none back the round counts as not evaluated (NaN), never as a made-up return."""
    returns = [r for inv in sorted(resp.invocations, key=lambda i: i.invocation_id) for r in inv.episode_returns]
    out = from_returns(returns)
    out.usd, out.cloud_usd, out.cloud_seconds = resp.cost_usd, resp.cloud_cost_usd, resp.cloud_seconds
    failed = [inv for inv in resp.invocations if not inv.ok]
    if failed:
        first = failed[0]
        out.notes.append(f"evaluation: {len(failed)} of {len(resp.invocations)} function(s) failed "
                         f"({first.error_type}: {first.error_message[:200]}); {len(returns)}/{episodes} episodes")
    elif len(returns) != episodes:
        out.notes.append(f"evaluation: {len(returns)}/{episodes} episodes came back")
    return out


def done(value: Evaluated) -> Future:
    """An evaluation that already ran (on the learner), as the Future the loops wait on."""
    f: Future = Future()
    f.set_result(value)
    return f
