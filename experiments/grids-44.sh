#!/usr/bin/env bash
# Issue 44 item 3: several envs per actor as the default only if it learns as well. PPO `tuned`, the default actor
# count (fixed:8), 100 rounds of 8 x 512 steps (409,600 env steps: equal samples in both arms), 10 seeds, evaluation
# every 5 rounds with 10 deterministic episodes; envs_per_actor 1 against 16 (the most an actor of 512 steps runs:
# one env per 32 steps, nitro.contracts.MIN_STEPS_PER_ENV, where sampling is fastest: bench/actor_sampling.py).
# Each arm is a grid of its own (their run ids would collide in one); seeds interleave the arms, so a grid cut short
# leaves paired seeds. Resumable: a finished run is skipped. Run from a clone at a fixed commit, as grids-40.sh says.
#   NITRO_PROTOCOL_MAIN_REPO=$PWD COMMIT=REV CLONE=$PWD/../grid-clone44 PART=envs ../grid-outer4/experiments/grids-44.sh
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-$PWD/../grid-clone}
PART=${PART:?set PART: envs}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" protocol --reps 2000 "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }
case "$PART" in
  envs)
    for env in Hopper-v5 Walker2d-v5; do
      slug=$(echo "$env" | tr 'A-Z' 'a-z')
      for seed in 0 1 2 3 4 5 6 7 8 9; do
        for envs in 1 16; do
          grid --env "$env" --schemes fixed:8 --rounds 100 --i-min 8 --eval-every 5 --envs-per-actor "$envs" \
            --seed-list "$seed" --name "protocol-$slug-ppo-tuned-envs$envs"
        done
      done
    done ;;
  *) echo "unknown PART $PART"; exit 2 ;;
esac
