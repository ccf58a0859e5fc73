"""Seeds a job derives from its spec's seed.

Every seed a job draws for one piece of its work (an actor invocation's sampling, a round's
evaluation, a Stellaris learner function's minibatches) is `derived_seed(spec.seed, *parts)`, the
parts naming that piece (round, wave, slot, a tag). The learner uses it; so does anything that
reproduces a job's draws outside it (experiments/signal.py, `nitro eval` given a round's seed).
"""

from __future__ import annotations

import numpy as np


def derived_seed(seed: int, *parts: int) -> int:
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1)[0])
