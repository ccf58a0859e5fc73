#!/usr/bin/env bash
# Issue 39 item 6: IMPACT's V-trace from the learner's online critic (0a9283b) against the target network's (the
# behaviour before), Hopper-v5 IMPACT `tuned`, fixed:16 (IMPACT's default), 5 seeds, the two alternating seed by
# seed; then the rest of grids-39.sh (Stellaris and the central learner under nitro). Resumable.
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-$PWD/../grid-clone3}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" protocol --env Hopper-v5 --reps 2000 "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }
for seed in 0 1 2 3 4; do
  for critic in online target; do
    grid --algo impact --schemes fixed:16 --vtrace-critic "$critic" --seed-list "$seed" \
      --name "protocol-hopper-v5-impact-tuned-vtrace-$critic"
  done
done
COMMIT=$COMMIT CLONE=$CLONE experiments/grids-39.sh
