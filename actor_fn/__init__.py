"""Serverless functions: the actor (`handler`) and the Stellaris learner function (`learner_handler`)."""

import os

# One BLAS thread per function, set before numpy loads: a function has about one vCPU, and where several
# share cores (the local endpoint's warm workers) OpenBLAS's spinning threads stall each other. A
# rollout's batched critic pass is large enough for OpenBLAS to thread: with its default, 16 actors on
# 2 cores sampled a round in 0.64 s instead of 0.30 s (bench/vs_sb3.py's job, 2026-11-27).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
