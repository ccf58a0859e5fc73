#!/usr/bin/env bash
# Issue 40 stage 1: the fixed counts and the new scaling policies (grow, noise, noise-replay, noise-adascale) on
# Hopper-v5 and Walker2d-v5, PPO tuned, 10 seeds each. A part is chosen by PART (fixed4-walker first: it needs
# no new code). Resumable: a finished run is skipped. Run from a clone at a fixed commit.
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-$PWD/../grid-clone}
PART=${PART:?set PART: fixed4-walker}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" protocol --reps 2000 "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }
case "$PART" in
  fixed4-walker)  # Walker2d-v5 fixed:4 over 200 rounds spends fixed:8's 100-round bill (as Hopper's -r200)
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Walker2d-v5 --schemes fixed:4 --rounds 200 --seed-list "$seed" --name protocol-walker2d-v5-ppo-tuned-r200
    done ;;
  *) echo "unknown PART $PART"; exit 2 ;;
esac
