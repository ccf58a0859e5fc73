#!/usr/bin/env bash
# Issue 39 item 5: Stellaris (staleness per base, ef48309) against the central learner on Hopper-v5, 10 seeds,
# fixed:8 then nitro, under the corrected cost model; the two learner modes alternate seed by seed so that
# the machine's speed on the day is shared alike. Resumable: a finished run is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-$PWD/../grid-clone3}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" protocol --env Hopper-v5 --reps 2000 "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }
for scheme in fixed:imin nitro; do
  for seed in 0 1 2 3 4 5 6 7 8 9; do
    grid --learner-mode stellaris --schemes "$scheme" --seed-list "$seed" --name protocol-hopper-v5-ppo-tuned-stellaris-v2
    grid --schemes "$scheme" --seed-list "$seed" --name protocol-hopper-v5-ppo-tuned-beside-stellaris-v2
  done
done
