"""Budget guard: never plan a round that the remaining budget cannot pay for."""

from __future__ import annotations

import math

from nitro.errors import ConfigError

EXHAUSTED = "budget exhausted"
# Dollar amounts closer than this are equal: 0.30 - 0.10 must buy 20 actors at 0.01. The guard can
# therefore overspend by at most a billionth of a dollar per round.
USD_TOLERANCE = 1e-9


MAX_ACTORS_CONSIDERED = 10**9  # no plan needs more; keeps money // unit a finite int for any budget


def _affordable(money: float, unit: float) -> int:
    """Largest a with a * unit <= money (money already includes the tolerance)."""
    ratio = money // unit
    if not math.isfinite(ratio) or ratio >= MAX_ACTORS_CONSIDERED:
        return MAX_ACTORS_CONSIDERED
    a = int(ratio)
    while (a + 1) * unit <= money:
        a += 1
    while a > 0 and a * unit > money:
        a -= 1
    return a


def plan_within_budget(desired_actors: int, i_min: int, cost_per_actor_usd: float, fixed_round_cost_usd: float,
                       budget_left_usd: float | None) -> tuple[int, bool, str]:
    """(actors, exhausted, reason) for a round costing fixed + actors * per_actor.

    Scales down to what is affordable; when even min(I_min, desired) actors
    are not, returns (0, True, "budget exhausted") and the job should end.
    budget_left_usd None (or +inf) means no budget.
    """
    if isinstance(desired_actors, bool) or not isinstance(desired_actors, int) or desired_actors < 1:
        raise ConfigError(f"invalid value for desired_actors: must be an integer >= 1, got {desired_actors!r}")
    if isinstance(i_min, bool) or not isinstance(i_min, int) or i_min < 1:
        raise ConfigError(f"invalid value for i_min: must be an integer >= 1, got {i_min!r}")
    for field, v in (("cost_per_actor_usd", cost_per_actor_usd), ("fixed_round_cost_usd", fixed_round_cost_usd)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"invalid value for {field}: must be a finite number >= 0, got {v!r}")
    if budget_left_usd is None or budget_left_usd == math.inf:
        return desired_actors, False, "no budget limit"
    if math.isnan(budget_left_usd):
        raise ConfigError("invalid value for budget_left_usd: must be a number or None, got nan")
    floor = min(i_min, desired_actors)
    money = budget_left_usd - fixed_round_cost_usd + USD_TOLERANCE
    if money < 0:
        return 0, True, EXHAUSTED
    affordable = desired_actors if cost_per_actor_usd == 0 else _affordable(money, cost_per_actor_usd)
    if affordable >= desired_actors:
        return desired_actors, False, "within budget"
    if affordable >= floor:
        return affordable, False, (f"scaled down from {desired_actors} to {affordable} actors: "
                                   f"{budget_left_usd:.6f} USD left")
    return 0, True, EXHAUSTED
