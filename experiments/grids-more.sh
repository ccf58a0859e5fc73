#!/usr/bin/env bash
# Issue 14's larger environments, after experiments/grids.sh (same clone, same commit, resumable);
# experiments/grids-ctl.sh start runs both in order.
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-/work/grid-clone}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }

while [ -f "$CLONE/.nitro-protocol.lock" ] && kill -0 "$(cat "$CLONE/.nitro-protocol.lock")" 2>/dev/null; do sleep 30; done

# Fig. 15 at the paper's scale: the other scaling schemes on the Hopper grid's settings, into its out dir
# (its nitro and fixed runs are the comparison). MinionsRL needs a pre-trained scheduler: `experiments fig15`.
grid protocol --env Hopper-v5 --schemes hydrozoa,kungfu --seeds 5
grid protocol --env Humanoid-v5 --schemes nitro,fixed:imin,fixed:nbar,schedule,shuffled --seeds 3
# Atari: CNN inference on 2 CPU cores makes every run long; the three schemes that answer "timing or samples?".
grid protocol --env ALE/Qbert-v5 --preset paper-atari --schemes nitro,fixed:imin,fixed:nbar --seeds 3
