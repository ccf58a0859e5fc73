#!/usr/bin/env bash
# Start, stop or inspect the background grids (experiments/grids.sh, then experiments/grids-more.sh), from the
# main repository, with the clone at one commit:
#   COMMIT=134243b experiments/grids-ctl.sh start    # resumes: finished runs are skipped
#   experiments/grids-ctl.sh status                  # what runs, the last finished runs
#   experiments/grids-ctl.sh stop                    # ends the current run too; its partial directory is deleted
#                                                    # (and any other `python -m experiments protocol` on this machine)
# A run cut short leaves a run directory without summary.json; start and stop delete those (the run is redone),
# and a grid directory with no finished run that git does not track yet.
set -uo pipefail
cd "$(dirname "$0")/.."
CLONE=${CLONE:-/work/grid-clone}
CLONE2=${CLONE2:-/work/grid-clone2}  # grids-more.sh's later grids
LOGS=results/protocol-logs

delete_partial_runs() {
  for d in docs/results/grids/*/runs/*/; do
    [ -d "$d" ] && [ ! -f "$d/summary.json" ] && { echo "deleting the partial run $d"; rm -rf "$d"; }
  done
  for g in docs/results/grids/*/; do  # a grid that had just begun: no finished run, nothing committed yet
    [ -z "$(ls -A "$g/runs" 2>/dev/null)" ] && [ -z "$(git ls-files "$g")" ] && { echo "deleting the empty grid $g"; rm -rf "$g"; }
  done
  return 0
}

running() { pgrep -f "experiments/grids(-more)?\.sh" >/dev/null; }

case "${1:-status}" in
  start)
    COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
    if running; then echo "grids already running:"; pgrep -af "experiments/grids"; exit 1; fi
    delete_partial_runs
    rm -f "$CLONE/.nitro-protocol.lock" "$CLONE2/.nitro-protocol.lock"
    mkdir -p "$LOGS"
    # grids-more.sh waits for the clone's lock only, which is free between two grids: chain it instead.
    # The grid redoes a cut-short run itself (it deletes the partial run and starts it again): a learner that
    # also resumed the interrupted job would run a twin beside it, sharing the cores and the endpoint's 64
    # concurrent actors (throttled actors, inflated clocks). The harness now says so itself
    # (LocalSystem(resume_jobs=False)); clones at earlier commits get it from the environment LocalSystem passes on.
    export NITRO_RESUME_JOBS=0
    COMMIT=$COMMIT nohup bash -c 'experiments/grids.sh; experiments/grids-more.sh' >> "$LOGS/grids.log" 2>&1 &
    echo "grids started (pid $!), commit $COMMIT; log: $LOGS/grids.log"
    ;;
  stop)
    pkill -f "experiments/grids.sh; experiments/grids-more.sh"
    pkill -f "experiments/grids(-more)?\.sh"
    pkill -f "python -m experiments protocol"
    pkill -f "$CLONE/.venv/bin/python"
    pkill -f "$CLONE2/.venv/bin/python"  # its grids, and the minions pre-training
    sleep 3
    pkill -9 -f "python -m experiments protocol"
    pkill -9 -f "$CLONE/.venv/bin/python"
    pkill -9 -f "$CLONE2/.venv/bin/python"
    sleep 1
    delete_partial_runs
    rm -f "$CLONE/.nitro-protocol.lock" "$CLONE2/.nitro-protocol.lock" results/minions/*.part.npz
    git checkout -- docs/results/grids/*/grid.json 2>/dev/null  # a grid.json its run had not committed yet
    echo "grids stopped"
    ;;
  status)
    if running; then echo "running:"; pgrep -af "experiments/grids|experiments protocol" | grep -v grids-ctl | cut -c1-160
    else echo "not running"; fi
    grep -h "SUCCEEDED, \|FAILED" "$LOGS"/grids*.log 2>/dev/null | tail -5
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
