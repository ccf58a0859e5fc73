"""The round loops' own tuning constants, in one place. What other processes share (Redis keys, invocation
ids, MAX_EMPTY_ROUNDS, DETECTOR_SUBSET, ...) lives in nitro/contracts.py."""

from __future__ import annotations

import os

# -- rounds -------------------------------------------------------------------------------------------
MAX_WAVES = 3  # on-policy: the planned launch plus up to two waves of replacements
LOST_BATCH_GRACE_S = 5.0  # a launched actor whose batch is still missing this long after it returned is lost
TAKEOVER_POLL_S = 1.0  # a resumed learner reads this often whether the waves it took over still run (nitro.launches)
WAVE_RECORD_TTL_S = 7 * 24 * 3600  # a round's wave records outlive any resume of it
RECENT_EPISODES = 20  # train_return and mean_episode_length average the latest this many episodes
# Evaluation seeds: derived from (seed, round, 2, 1). Not (seed, round, 2, 0): numpy's SeedSequence ignores trailing
# zeros, so that was the seed of an actor launch's (seed, round, wave 2) and evaluated on its replacement actors'
# episode seeds. Four parts ending in 1 are never a three-part actor launch's.
EVAL_SEED_TAG = 2

# -- reading the trajectory stream: (entries per read, block ms) ----------------------------------------
ONPOLICY_READ = (64, 100)  # the on-policy loop only waits for its round's batches
PIPELINED_READ = (16, 20)  # the asynchronous loops learn between reads: short blocks

# -- the off-policy (IMPACT) loop -------------------------------------------------------------------------
MAX_REPLAYS_PER_FRESH = 1  # replay updates allowed per fresh batch: keeps replay from dominating

# -- the Stellaris loop -------------------------------------------------------------------------------
LOST_UPDATE_GRACE_S = 5.0  # a learner function whose update is still missing this long after it returned is lost
MAX_LEARNER_THREADS = 24  # one blocking Launch per learner in flight; the scaler serves 32 RPCs at once
UPDATE_STREAM_TTL_S = 24 * 3600

# -- data plane and durability ------------------------------------------------------------------------
POLICY_TTL_S = 3600  # published policies, sample subsets and parcels
CHECKPOINT_FORMAT = 2
IO_THREADS = 4  # a loop's background calls: launch, score, commit, evaluation functions

# -- riding out outages -----------------------------------------------------------------------------
# How long a Redis outage (restart) is ridden out before the job fails, resumable.
REDIS_PATIENCE_S = float(os.environ.get("NITRO_REDIS_PATIENCE_S", "60"))
REDIS_FIRST_RETRY_S = 0.1
RPC_FIRST_RETRY_S = 0.2
MAX_RETRY_DELAY_S = 5.0  # backoff doubles up to this
COST_PATIENCE_S = 30.0  # GetCost retried this long
# EndJob from a learner shutting down (a drain): its scaler may be going down with it (a killed supervisor
# SIGTERMs every component) and its next start asks again, so the shutdown is not held COST_PATIENCE_S.
DRAIN_END_JOB_PATIENCE_S = 2.0
LAUNCH_TIMEOUT_SLACK_S = 30.0  # a blocking Launch's RPC deadline beyond the round deadline

DRAIN_STOP_REASON = "learner shutting down"  # a job's stop reason when its learner drains (resumable, not reported)
