"""Stellaris (Yu et al., SC 2024): asynchronous serverless learners, as functions.

Three roles meet here. Actors sample with policy version v_b (the behaviour
policy mu). A serverless learner function loads the policy version v_g the
parameter service named when it invoked it (its *base*), computes an update
from one trajectory batch and pushes it with v_g. The parameter service keeps
the authoritative policy and the version clock v and applies updates as they
arrive, weighted by their staleness s: the versions since v_g that applied
another base's update (below).

Global importance-sampling truncation (the poster's "Truncate(pi_2/pi_1,
pi_3/pi_1)"). pi_1 = mu is the behaviour policy, pi_2 = pi_{v_g} the learner's
own policy and pi_3 the newest policy the learner can see when it runs
(`policy:latest`, which other learners' updates may already have moved past
v_g). We read Truncate(x, y) as truncation from above, min(x, y), as V-trace
does with min(rho_bar, pi/mu), and generalise pi_3 to the set R of the
`recent_versions` newest published versions after v_g:

    rho_t = min(rho_bar, pi_2(a_t|x_t) / mu(a_t|x_t), min_{j in R} pi_j(a_t|x_t) / mu(a_t|x_t))

A sample keeps the weight its own learner would give it only if no newer
policy disagrees: when the global policy has already moved away from an
action, the stale learner cannot over-weight it. rho_t is data (no gradient).
With fresh data (mu = pi_2, R empty) and rho_bar >= 1, rho_t = 1.

The learner's loss, per minibatch, applies rho once. PPO: A is GAE on the
behaviour values (no importance weight in it), standardised as PPOLearner does
(`normalize_batch_advantages` over the batch, `normalize_advantages` per
minibatch), r = pi_theta / pi_2, and rho weights the surrogate:

    L = -mean(rho min(r A, clip(r, 1-eps, 1+eps) A)) + kl_coeff mean(KL(pi_2 || pi_theta))
        + value_coeff L_V - entropy_coeff mean(H)            (L_V: PPO's, `value_clip_mode`)

For fresh data it is exactly PPO's loss, so the update is PPOLearner's for every
preset. IMPACT: the loss is IMPACT's with pi_2 as the target network. Its
V-trace advantage already carries an importance weight, so the global
truncation goes there instead of on top of it, replacing V-trace's
min(pg_rho_bar, pi_2/mu):

    A_t = min(pg_rho_bar, rho_t) (r_t + gamma v_{t+1} - V_2(x_t))   (v: V-trace targets against pi_2)
    r   = pi_theta / max(pi_2, mu / is_ratio_clip)                   (nitro.algos.impact.reference_logp)
    L   = -mean(min(r A, clip(r, 1-eps, 1+eps) A)) + kl_coeff mean(KL(pi_2 || pi_theta))
          + value_coeff 0.5 mean((V - v)^2) - entropy_coeff mean(H)

With R empty and rho_bar >= pg_rho_bar it is exactly IMPACT's update with
target network pi_2. The function runs the algorithm's epochs x minibatches of
Adam on the loss, starting from pi_2, and pushes the flat update g =
theta_{v_g} - theta_local (the learning-rate-scaled sum of its gradient steps;
one plain SGD step of rate eta gives g = eta grad L).

Staleness-aware aggregation. The version clock v counts published policy
versions: every aggregation that applies something publishes one and advances
v by one (as the parameter function of Stellaris advances its clock once per
aggregation). The staleness of base v_g (`StalenessLedger`) counts the versions
published since v_g by aggregations that applied an update from another base:
a version made only of v_g's own updates (its siblings, the learners launched
from v_g) is a piece of v_g's shared step, not a change its siblings missed.
So s_g <= v - v_g, equal to it unless some version was v_g's alone, and the
siblings of one base have the same staleness however their arrivals are
grouped into polls (counting every version, siblings arriving one per poll
made each other stale: 16 of them applied 0.21 of one step, read together 1).
The bound b_k of round k (`staleness_bound`) decides: 0 <= s <= b_k is applied,
s > b_k (or a base from the future) is dropped. With n_g the number of learner
functions the service launched from base v_g, one aggregation moves the
policy once:

    theta <- theta - sum_{i applied} (w(s_i) / n_{g_i}) g_i,        v <- v + 1

Each learner's g is a whole local PPO/IMPACT update (epochs of Adam, inside
the clip range of its base), so the n_g updates computed from one base share
one step: together they move the policy by a mean of their updates with
weights w(s) / n_g <= 1 / n_g, at most max_i |g_i| however many actors the
round had; with no other base's update applied between their arrivals,
exactly w(s) times their mean however the arrivals were grouped (all fresh:
the synchronous data-parallel step, applied in pieces). Summing them instead
would take n_g trust-region steps at once. A lone update (n_g = 1) keeps its
weight: a single fresh update moves the policy to the learner's result, so
with one learner at a time stellaris mode is the central learner. n_g is
final when an update from v_g is first applied: base v_g is handed out only
while the clock reads v_g, and applying anything moves the clock on.

A learner is launched with the current clock as its base (staleness 0). Its
update is certain to be dropped once its base's staleness exceeds the bound,
because that staleness only grows and the bound only tightens. The service
writes its ledger's staleness per base as a signed record before each version
it publishes; the learner function reads it, checks (`certainly_dropped` with
the bound its parcel carries) before it computes and pushes a signed skip
record instead of an update that could never be applied.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nitro.algos.impact import impact_surrogate, reference_logp
from nitro.algos.ppo import collate, normalize, standardize_batch, value_loss
from nitro.algos.sgd import adam, kl_per_sample, kl_term, minibatch_sgd
from nitro.algos.vtrace import vtrace_batches
from nitro.config import BOUND_SCHEDULES
from nitro.config import STALENESS_WEIGHTS as WEIGHT_FUNCTIONS
from nitro.errors import ConfigError
from nitro.policy.models import Policy

PARCEL_FORMAT = 1
STALENESS_FORMAT = 1


# -- staleness weights and the dynamic bound --------------------------------------------------------

def staleness_weight(staleness: int | float, kind: str = "inverse", decay: float = 1.0) -> float:
    """w(s) in (0, 1], decreasing in s, w(0) = 1.

    inverse: w = (1 + s)^(-decay)   (decay 1: 1 / (1 + s))
    exp:     w = exp(-decay s)
    none:    w = 1                  (no staleness awareness; the bound still drops)
    """
    s = float(staleness)
    if s < 0 or not math.isfinite(s):
        raise ValueError(f"staleness must be a finite number >= 0, got {staleness!r}")
    if decay < 0 or not math.isfinite(decay):
        raise ValueError(f"decay must be a finite number >= 0, got {decay!r}")
    if kind == "inverse":
        return (1.0 + s) ** (-decay)
    if kind == "exp":
        return math.exp(-decay * s)
    if kind == "none":
        return 1.0
    raise ConfigError(f"unknown staleness weight {kind!r}; allowed: {list(WEIGHT_FUNCTIONS)}")


def staleness_bound(round_index: int, rounds: int, start: int, end: int, schedule: str = "linear") -> int:
    """The largest staleness applied in round `round_index` of `rounds`, tightening from start to end.

    f = round_index / (rounds - 1), clamped to [0, 1] (0 for a one-round job):
    linear:    b = start + (end - start) f
    geometric: 1 + b = (1 + start) ((1 + end) / (1 + start))^f   (the +1 lets end be 0)
    constant:  b = start
    rounded down (never looser than the schedule), so b = end at the last round.
    """
    if start < 0 or end < 0:
        raise ValueError(f"staleness bounds must be >= 0, got start={start}, end={end}")
    if schedule not in BOUND_SCHEDULES:
        raise ConfigError(f"unknown bound schedule {schedule!r}; allowed: {list(BOUND_SCHEDULES)}")
    f = min(max(round_index / (rounds - 1), 0.0), 1.0) if rounds > 1 else 0.0
    if schedule == "constant":
        value = float(start)
    elif schedule == "linear":
        value = start + (end - start) * f
    else:
        value = (1.0 + start) * ((1.0 + end) / (1.0 + start)) ** f - 1.0
    return int(math.floor(value + 1e-9))  # 1e-9: 2.9999999 from float error is 3


@dataclass(frozen=True)
class Aggregation:
    """What `aggregate_queue` decided for a queue of updates, in queue order."""

    staleness: tuple[int, ...]
    weights: tuple[float, ...]  # w(s) for applied updates, 0.0 for dropped ones
    applied: tuple[bool, ...]
    coefficients: tuple[float, ...]  # w(s) / n_base: what multiplies g; 0.0 for dropped ones

    @property
    def n_applied(self) -> int:
        return sum(self.applied)

    @property
    def n_dropped(self) -> int:
        return len(self.applied) - self.n_applied


def aggregate_queue(bases: Sequence[int], version: int, bound: int, kind: str = "inverse",
                    decay: float = 1.0, launched: Mapping[int, int] | None = None,
                    staleness: Mapping[int, int] | None = None) -> Aggregation:
    """Apply-or-drop, the weight and the coefficient of every update read in one aggregation at clock `version`.

    s_i = staleness[bases[i]], the base's staleness as the caller's `StalenessLedger` counts it
    (versions published since the base by aggregations that applied an update from another
    base); a base it does not list is measured by the version count version - bases[i], an
    upper bound of its staleness (without `staleness`, every base is). Applied iff
    0 <= s_i <= bound. A base newer than the clock cannot come from this parameter service (a
    restarted one, or forged): dropped, with its negative version count reported as is.
    coefficient_i = w(s_i) / n_{bases[i]}, n_b = launched[b], the learners launched from base b
    (at least the number of updates from b in this queue; without `launched`, that number).
    """
    clock = int(version)
    in_queue = Counter(int(b) for b in bases)
    launched = launched or {}
    staleness = staleness or {}
    stal, weights, applied, coeffs = [], [], [], []
    for b in bases:
        b = int(b)
        s = int(staleness[b]) if b in staleness and b <= clock else clock - b
        ok = 0 <= s <= bound
        w = staleness_weight(s, kind, decay) if ok else 0.0
        stal.append(s)
        applied.append(ok)
        weights.append(w)
        coeffs.append(w / max(int(launched.get(b, 0)), in_queue[b]) if ok else 0.0)
    return Aggregation(tuple(stal), tuple(weights), tuple(applied), tuple(coeffs))


class StalenessLedger:
    """The parameter service's bookkeeping per base version it handed out: the learners launched from
    it (n_g) and its staleness s_g.

    s_g counts the versions published since v_g by aggregations that applied at least one update
    from another base. A version made only of v_g's own updates (siblings: learners launched from
    v_g) is a part of v_g's shared step, not a change the siblings missed, so it does not make the
    others stale: siblings get the same staleness however their arrivals are grouped into polls,
    and together they take w(s) of one step. Every other version counts, as in the version clock:
    s_g <= clock - v_g, with equality when no version was v_g's alone.

    `launch` at dispatch (the base is the clock: staleness 0), `aggregate` for one poll's queue,
    `advance` when that aggregation moved the policy (before the clock ticks), `forget` the bases
    beyond the bound. A base the ledger does not list is measured by the version count, which
    for a forgotten base is above the bound (s_g only grows and the bound only tightens), so its
    updates are dropped.
    """

    def __init__(self) -> None:
        self.launched: dict[int, int] = {}  # base -> learners launched from it
        self.staleness: dict[int, int] = {}  # base -> versions since it that applied another base's update

    def launch(self, base: int) -> None:
        b = int(base)
        self.launched[b] = self.launched.get(b, 0) + 1
        self.staleness.setdefault(b, 0)

    def staleness_of(self, base: int, version: int) -> int:
        """s of an update from `base` read at clock `version` (the version count for an unlisted base)."""
        b = int(base)
        return self.staleness[b] if b in self.staleness and b <= int(version) else int(version) - b

    def aggregate(self, bases: Sequence[int], version: int, bound: int, kind: str = "inverse",
                  decay: float = 1.0) -> Aggregation:
        return aggregate_queue(bases, version, bound, kind, decay, launched=self.launched, staleness=self.staleness)

    def advance(self, bases: Sequence[int], agg: Aggregation) -> None:
        """The aggregation `agg` of `bases` published a version: every listed base gets one version staler
        unless every update it applied came from that base."""
        applied = {int(b) for b, a in zip(bases, agg.applied) if a}
        if not applied:
            return
        for b in self.staleness:
            if applied - {b}:
                self.staleness[b] += 1

    def forget(self, bound: int) -> list[int]:
        """Drop the bases whose updates can no longer be applied (s > bound); returns them."""
        gone = [b for b, s in self.staleness.items() if s > bound]
        for b in gone:
            del self.staleness[b]
            self.launched.pop(b, None)
        return gone

    def record(self, version: int) -> dict:
        """What learner functions read to check their base (`staleness_record_key`, signed)."""
        return {"format": STALENESS_FORMAT, "version": int(version), "staleness": dict(self.staleness)}


def base_staleness(record: dict | None, base: int) -> int | None:
    """A learner's staleness from the service's staleness record: the listed s of `base`, else the
    version count record["version"] - base (0 for a base handed out after the record; above the
    bound for a base the service forgot). None without a usable record."""
    if not isinstance(record, dict) or record.get("format") != STALENESS_FORMAT:
        return None
    version, table = record.get("version"), record.get("staleness")
    if type(version) is not int or not isinstance(table, dict):
        return None
    s = table.get(int(base))
    return int(s) if type(s) is int and int(base) <= version else version - int(base)


def certainly_dropped(staleness: int | None, bound: int | None) -> bool:
    """True when an update whose base already has `staleness` (a value the service's ledger has
    reached, `base_staleness`) can no longer be applied: staleness > bound. A base's staleness
    only grows and a job's bounds only tighten, so with `bound` the bound of the current round or
    an earlier one, the update's staleness at any later aggregation exceeds that aggregation's
    bound. None (no record, no bound): not certain."""
    return staleness is not None and bound is not None and int(staleness) > int(bound)


def combined_update(updates: Sequence[np.ndarray | torch.Tensor], agg: Aggregation) -> torch.Tensor | None:
    """sum_{applied} coefficient_i g_i, float32; None when nothing is applied."""
    picked = [(torch.as_tensor(g, dtype=torch.float32), c) for g, c, a in zip(updates, agg.coefficients, agg.applied)
              if a]
    if not picked:
        return None
    total = torch.zeros_like(picked[0][0])
    for g, c in picked:
        total.add_(g, alpha=c)
    return total


def flat_parameters(policy: Policy) -> torch.Tensor:
    """Every trainable parameter in `parameters()` order (buffers such as observation statistics excluded)."""
    return torch.nn.utils.parameters_to_vector(policy.parameters()).detach().clone()


@torch.no_grad()
def apply_update(policy: Policy, update: torch.Tensor) -> None:
    """theta <- theta - update, in place (update already weighted by `combined_update`)."""
    theta = torch.nn.utils.parameters_to_vector(policy.parameters())
    if update.shape != theta.shape:
        raise ValueError(f"update has {update.numel()} values, the policy {theta.numel()} parameters")
    torch.nn.utils.vector_to_parameters(theta - update.to(theta.dtype), policy.parameters())


# -- global importance-sampling truncation ----------------------------------------------------------

def global_truncated_ratio(logp_learner: torch.Tensor, logp_behaviour: torch.Tensor,
                           logp_recent: torch.Tensor | None = None, rho_bar: float = 1.0) -> torch.Tensor:
    """rho_t = min(rho_bar, pi_2/mu, min_j pi_j/mu) per sample, without gradient.

    logp_learner: log pi_2(a_t|x_t), the learner function's own (base) policy, shape (N,).
    logp_behaviour: log mu(a_t|x_t) from the batch, shape (N,).
    logp_recent: log pi_j(a_t|x_t) of the newest versions after the base, shape (K, N); None or K = 0
      gives the learner-local truncation min(rho_bar, pi_2/mu).
    """
    return torch.exp(_log_truncated_ratio(logp_learner, logp_behaviour, logp_recent, rho_bar)).to(logp_learner.dtype)


def _log_truncated_ratio(logp_learner: torch.Tensor, logp_behaviour: torch.Tensor,
                         logp_recent: torch.Tensor | None, rho_bar: float) -> torch.Tensor:
    """log rho_t in float64 (see `global_truncated_ratio`)."""
    if not rho_bar > 0:
        raise ValueError(f"rho_bar must be > 0, got {rho_bar!r}")
    log_r = (logp_learner.detach().double() - logp_behaviour.detach().double())
    if logp_recent is not None and logp_recent.numel():
        newest = (logp_recent.detach().double() - logp_behaviour.detach().double()).min(dim=0).values
        log_r = torch.minimum(log_r, newest)
    return log_r.clamp(max=math.log(rho_bar))


# -- the learner function's loss and update ---------------------------------------------------------

def stellaris_loss(logp_new: torch.Tensor, logp_ref: torch.Tensor, weights: torch.Tensor, adv: torch.Tensor,
                   v_new: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor,
                   kl: torch.Tensor, *, clip: float, kl_coeff: float, value_coeff: float, entropy_coeff: float,
                   value_clip: float = 0.0, value_clip_mode: str = "ppo2"
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-mean(w min(r A, clip(r) A)) + kl_coeff KL + value_coeff L_V - entropy_coeff H, r = pi_theta / exp(logp_ref).

    `prepare` gives logp_ref and w: PPO log pi_2 and rho, IMPACT log max(pi_2, mu / is_ratio_clip) and 1.
    L_V is PPO's `value_loss` (IMPACT: value_clip 0, the plain 0.5 mean((V - v_s)^2)).
    """
    pg = -impact_surrogate(logp_new, logp_ref, weights, adv, clip)
    vl = value_loss(v_new, v_old, returns, value_clip, value_clip_mode)
    ent = entropy.mean()
    kl_mean = kl.mean()
    clip_frac = ((torch.exp(logp_new - logp_ref) - 1.0).abs() > clip).float().mean()
    total = pg + kl_coeff * kl_mean + value_coeff * vl - entropy_coeff * ent
    return total, {"policy_loss": pg, "value_loss": vl, "entropy": ent, "kl": kl_mean, "clip_frac": clip_frac}


@torch.no_grad()
def _logp_values(policy: Policy, obs: torch.Tensor, actions: torch.Tensor):
    dist = policy.distribution(obs)
    return policy.log_prob(dist, actions), policy.value(obs), dist


def prepare(base: Policy, batches: list[dict], config, algo: str, *, rho_bar: float,
            recent: Sequence[Policy] = ()) -> tuple[dict[str, torch.Tensor], torch.distributions.Distribution]:
    """Advantages, value targets, truncated weights and the surrogate's fields for `batches`, with `base` as pi_2.

    Both: rho = global_truncated_ratio(pi_2, mu, recent, rho_bar); logp_base = log pi_2.
    PPO: GAE(gamma, lambda) on the behaviour values, standardised over the batch when
    `normalize_batch_advantages` (as PPOLearner), value targets R = A + V_mu; the surrogate
    divides by pi_2 and is weighted by rho (logp_ref = logp_base, is_weights = rho).
    IMPACT: V-trace (rho_bar, c_bar of the config) with pi_2's log-probs and values; the
    advantage's importance weight is min(pg_rho_bar, rho) instead of V-trace's
    min(pg_rho_bar, pi_2/mu), and the surrogate adds none: logp_ref = log max(pi_2, mu /
    is_ratio_clip) (`reference_logp`), is_weights = 1.
    """
    obs = torch.as_tensor(np.concatenate([b["obs"] for b in batches]))
    actions = torch.as_tensor(np.concatenate([b["actions"] for b in batches]))
    logp_mu = torch.as_tensor(np.concatenate([b["logp"] for b in batches]).astype(np.float32))
    logp_base, values_base, base_dist = _logp_values(base, obs, actions)
    logp_recent = torch.stack([_logp_values(p, obs, actions)[0] for p in recent]) if recent else None
    log_rho = _log_truncated_ratio(logp_base, logp_mu, logp_recent, rho_bar)
    rho = torch.exp(log_rho).to(logp_base.dtype)
    if algo == "ppo":
        data = collate(batches, config.gamma, config.gae_lambda, config.reward_clip)
        adv, targets, v_old = data["advantages"], data["returns"], data["values"]
        if config.normalize_batch_advantages:  # once, over the whole batch, as PPOLearner.update
            adv = standardize_batch(adv)
        logp_ref, weights = logp_base, rho
    elif algo == "impact":
        vb = values_base.numpy()
        targets, adv = vtrace_batches(batches, logp_base.numpy(), vb, config)
        # V-trace's advantage is min(pg_rho_bar, pi_2/mu) * td; rescale it to min(pg_rho_bar, rho) * td
        # (rho <= pi_2/mu, so the factor is in [0, 1]; exactly 1 where the truncation does not bind).
        log_pg = math.log(config.pg_rho_bar)
        log_own = (logp_base.double() - logp_mu.double()).clamp(max=log_pg)
        factor = torch.nan_to_num(torch.exp(log_rho.clamp(max=log_pg) - log_own), nan=0.0)  # pi_2 = 0: A is 0
        adv = (torch.as_tensor(adv, dtype=torch.float64) * factor).float().numpy()
        v_old = vb
        logp_ref = reference_logp(logp_base.double(), logp_mu.double(), config.is_ratio_clip).to(logp_base.dtype)
        weights = torch.ones_like(rho)
    else:
        raise ConfigError(f"unknown algo {algo!r}; allowed: ['impact', 'ppo']")
    return {"obs": obs, "actions": actions, "logp": logp_mu, "logp_base": logp_base, "rho": rho,
            "logp_ref": logp_ref, "is_weights": weights, "advantages": torch.as_tensor(adv),
            "returns": torch.as_tensor(targets), "values": torch.as_tensor(v_old)}, base_dist


def compute_update(base: Policy, batches: list[dict], config, algo: str = "ppo", *, kl_coeff: float | None = None,
                   rho_bar: float = 2.0, recent: Sequence[Policy] = (), seed: int = 0) -> tuple[np.ndarray, dict]:
    """The learner function's work: local epochs from `base` on `batches`; returns (g, stats).

    g = theta_base - theta_local as float32 in `parameters()` order. Adam starts fresh (a
    function keeps no optimiser state between batches); minibatches are drawn as
    PPOLearner draws them from the same seed, and advantages are standardised and the value
    loss clipped as the config says (PPOLearner.update), so a fresh-data update reproduces a
    central PPO update on that batch (and, with no recent versions, an IMPACT update with
    target network pi_2).
    """
    cfg = config
    kl_coeff = cfg.kl_coeff if kl_coeff is None else kl_coeff
    data, base_dist = prepare(base, batches, cfg, algo, rho_bar=rho_bar, recent=recent)
    policy = copy.deepcopy(base)
    policy.requires_grad_(True)
    optimizer = adam(policy.parameters(), cfg.lr, cfg.adam_eps)
    generator = torch.Generator().manual_seed(seed)
    obs, actions = data["obs"], data["actions"]
    n = obs.shape[0]
    def loss_fn(idx):
        dist = policy.distribution(obs[idx])
        adv = normalize(data["advantages"][idx]) if cfg.normalize_advantages else data["advantages"][idx]
        return stellaris_loss(
            policy.log_prob(dist, actions[idx]), data["logp_ref"][idx], data["is_weights"][idx], adv,
            policy.value(obs[idx]), data["values"][idx], data["returns"][idx], policy.entropy(dist),
            kl_term(base_dist, dist, idx, kl_coeff), clip=cfg.clip, kl_coeff=kl_coeff, value_coeff=cfg.value_coeff,
            entropy_coeff=cfg.entropy_coeff, value_clip=getattr(cfg, "value_clip", 0.0),  # IMPACT: none
            value_clip_mode=getattr(cfg, "value_clip_mode", "ppo2"))

    sgd = minibatch_sgd(list(policy.parameters()), optimizer, generator, n, epochs=cfg.epochs,
                        minibatch_size=cfg.minibatch_size, max_grad_norm=cfg.max_grad_norm,
                        device=torch.device("cpu"), loss_fn=loss_fn, estimate_noise=False)
    with torch.no_grad():
        final_kl = float(kl_per_sample(base_dist, policy.distribution(obs), slice(None)).mean())
    g = (flat_parameters(base) - flat_parameters(policy)).numpy().astype(np.float32)
    rho = data["rho"]
    var = float(data["returns"].var(unbiased=False))
    ev = 1.0 - float((data["returns"] - data["values"]).var(unbiased=False)) / var if var > 1e-12 else 0.0
    stats = {**{k: sgd.means[k] for k in ("policy_loss", "value_loss", "entropy", "clip_frac", "grad_norm")},
             "kl": final_kl, "explained_variance": ev,
             "samples": int(n), "sgd_steps": sgd.steps, "rho_mean": float(rho.mean()),
             "truncated_fraction": float((rho < torch.exp(data["logp_base"] - data["logp"]) - 1e-6).float().mean()),
             "update_norm": float(np.linalg.norm(g))}
    return g, stats


# -- the parameter service's state ------------------------------------------------------------------

class ParameterServer:
    """The authoritative policy, its version clock and the adaptive KL coefficient.

    `aggregate` applies one queue of learner updates; the caller (the stellaris loop)
    publishes the new version. Observation statistics advance with the version: the
    observations of batches learned from since the last version are merged when it moves.
    """

    def __init__(self, spec, config, seed: int = 0, device: str = "cpu"):
        torch.manual_seed(seed)
        self.config = config
        self.policy = Policy(spec).to(torch.device(device))
        self.policy.requires_grad_(False)
        self.kl_coeff = config.kl_coeff
        self.updates = 0
        self.last_data: dict[str, np.ndarray] | None = None
        self.n_params = int(flat_parameters(self.policy).numel())

    def aggregate(self, updates: Sequence[np.ndarray], agg: Aggregation, kls: Sequence[float] = (),
                  obs: Sequence[np.ndarray] = ()) -> bool:
        """Apply the queue's combined update; True when the policy moved (the caller's clock advances by one).

        `self.updates` counts updates applied (not versions: one aggregation can apply several)."""
        total = combined_update(updates, agg)
        if total is None:
            return False
        apply_update(self.policy, total)
        if obs:
            self.policy.update_obs_stats(np.concatenate(list(obs)))
        applied_kls = [k for k, a in zip(kls, agg.applied) if a]
        if self.config.kl_coeff > 0 and applied_kls:
            from nitro.algos.ppo import adapt_kl_coeff

            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, float(np.mean(applied_kls)), self.config.kl_target)
        self.updates += agg.n_applied
        return True

    def state(self) -> dict:
        return {"policy": self.policy.state_dict(), "kl_coeff": self.kl_coeff, "updates": self.updates}

    def load_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.kl_coeff = state["kl_coeff"]
        self.updates = state["updates"]


# -- wire format shared by the parameter service and the learner function --------------------------
# (signed and verified in nitro.stellaris_records: the codec stays out of the algorithm)

def make_parcel(*, job_id: str, round_index: int, base_version: int, algo: str, config: dict, kl_coeff: float,
                rho_bar: float, recent_versions: int, seed: int, batches: list[dict],
                behaviour_versions: list[int], max_staleness: int | None = None) -> dict:
    """`max_staleness`: the staleness bound of the dispatching round, an upper bound on every bound the
    update can meet later (None: the learner never skips)."""
    return {"format": PARCEL_FORMAT, "job_id": job_id, "round": int(round_index), "base_version": int(base_version),
            "algo": algo, "config": dict(config), "kl_coeff": float(kl_coeff), "rho_bar": float(rho_bar),
            "recent_versions": int(recent_versions), "seed": int(seed), "batches": list(batches),
            "behaviour_versions": [int(v) for v in behaviour_versions],
            "max_staleness": None if max_staleness is None else int(max_staleness)}


def check_parcel(parcel) -> dict:
    """A decoded parcel, or ValueError naming what is wrong with it."""
    need = {"format": int, "job_id": str, "round": int, "base_version": int, "algo": str, "config": dict,
            "kl_coeff": float, "rho_bar": float, "recent_versions": int, "seed": int, "batches": list}
    if not isinstance(parcel, dict):
        raise ValueError("parcel is not a mapping")
    for name, typ in need.items():
        if not isinstance(parcel.get(name), typ) or isinstance(parcel.get(name), bool):
            raise ValueError(f"parcel field {name!r} is missing or not {typ.__name__}")
    if parcel["format"] != PARCEL_FORMAT:
        raise ValueError(f"parcel format {parcel['format']} is not {PARCEL_FORMAT}")
    if not parcel["batches"] or not all(isinstance(b, dict) for b in parcel["batches"]):
        raise ValueError("parcel holds no trajectory batch")
    bound = parcel.get("max_staleness")
    if bound is not None and (type(bound) is not int or bound < 0):
        raise ValueError("parcel field 'max_staleness' is not a non-negative int")
    return parcel


@dataclass
class UpdateRecord:
    """One learner function's result as the parameter service sees it.

    A skip record (`skipped`) has no update: the learner found its base already certain to be
    dropped (`certainly_dropped`) and computed nothing; stats["latest"] is the clock it saw."""

    invocation_id: str
    round: int
    base_version: int
    steps: int
    update: np.ndarray | None
    stats: dict

    @property
    def skipped(self) -> bool:
        return self.update is None


def skip_record(invocation_id: str, round_index: int, base: int, latest: int, bound: int,
                staleness: int) -> UpdateRecord:
    """What a learner pushes instead of an update certain to be dropped (`staleness` > `bound`)."""
    return UpdateRecord(invocation_id, int(round_index), int(base), 0, None,
                        {"skipped": "stale_base", "latest": int(latest), "bound": int(bound),
                         "staleness": int(staleness)})
