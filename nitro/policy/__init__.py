"""A policy and its environments: networks, the torch-free inference actors run, sampling, evaluation,
and trained policies out of checkpoints or exports."""
