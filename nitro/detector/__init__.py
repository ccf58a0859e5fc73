"""Boosting detector cores: HVPs of the surrogate, Lanczos, the convexity ratio and the boosting score."""

from nitro.detector.core import DetectionResult, detect
from nitro.detector.hvp import explicit_hessian, make_hvp, ppo_objective, ppo_surrogate, select_subset
from nitro.detector.lanczos import EigResult, lanczos
from nitro.detector.score import ScoreWindow, boosting_score, convexity_ratio

__all__ = ["DetectionResult", "detect", "explicit_hessian", "make_hvp", "ppo_objective", "ppo_surrogate",
           "select_subset", "EigResult", "lanczos", "ScoreWindow", "boosting_score", "convexity_ratio"]
