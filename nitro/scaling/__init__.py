"""Actor scaling: policies chosen by name, the gradient noise scale, and the budget guard."""

from nitro.scaling.base import DEFAULT_I_MAX, DEFAULT_I_MIN, RoundInputs, ScalingPolicy, check_range
from nitro.scaling.budget import EXHAUSTED, plan_within_budget
from nitro.scaling.noise import NoiseEstimate, noise_scale_estimates
from nitro.scaling.policies import make_policy

__all__ = ["DEFAULT_I_MAX", "DEFAULT_I_MIN", "RoundInputs", "ScalingPolicy", "check_range", "EXHAUSTED",
           "plan_within_budget", "NoiseEstimate", "noise_scale_estimates", "make_policy"]
