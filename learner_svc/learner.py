"""Transitional: the protocols moved to learner_svc/policy_owner.py (issue 43 item 3, `Learner` renamed
`PolicyOwner`). Only learner_svc/rounds.py and learner_svc/onpolicy.py still import them here, while they are
being rewritten; delete this module with their imports."""

from learner_svc.policy_owner import GradientLearner, ParameterAggregator
from learner_svc.policy_owner import PolicyOwner as Learner
from learner_svc.policy_owner import PolicyOwnerFactory as LearnerFactory

__all__ = ["GradientLearner", "Learner", "LearnerFactory", "ParameterAggregator"]
