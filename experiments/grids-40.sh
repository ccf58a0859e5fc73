#!/usr/bin/env bash
# Issue 40 stage 1: the fixed counts and the new scaling policies (grow, noise, noise-replay, noise-adascale) on
# Hopper-v5 and Walker2d-v5, PPO tuned, 10 seeds each. A part is chosen by PART (fixed4-walker first: it needs
# no new code). Resumable: a finished run is skipped. Run from a clone at a fixed commit.
#
# Every new arm's job is stopped by the harness at 1.1 B at reference rates (B = fixed:8's median bill over 100
# rounds at the `cpu` pricing: Hopper $0.0040618, Walker2d $0.0089191; experiments/sequential.py --plan prints
# them), so runs end at equal reference dollars whatever the machine's load does to the jobs' own cloud clocks.
# grow therefore ramps on rounds, not on the job's cloud-clock budget: 130 rounds with f1 0.55 and f2 0.87 put
# its doublings at 0.4 B and 0.8 B at reference rates on both environments (the same --plan).
#
# Run it from a clone too (the outer command imports experiments/ from where it runs, so edits in the main tree
# must not reach it), with results going to the main repository:
#   git clone -q . ../grid-outer && git -C ../grid-outer checkout -q REV && ln -s "$PWD/.venv" ../grid-outer/.venv
#   NITRO_PROTOCOL_MAIN_REPO=$PWD COMMIT=REV CLONE=$PWD/../grid-clone40 PART=... ../grid-outer/experiments/grids-40.sh
set -uo pipefail
cd "$(dirname "$0")/.."
COMMIT=${COMMIT:?set COMMIT to the commit the grids run}
CLONE=${CLONE:-$PWD/../grid-clone}
PART=${PART:?set PART: fixed4-walker, fixed16-grow, fixed16-hopper, noise (needs KAPPA), grow-walker16}
P=(.venv/bin/python -m experiments)
grid() { "${P[@]}" protocol --reps 2000 "$@" --clone "$CLONE" --commit "$COMMIT" || echo "grid failed: $*"; }
case "$PART" in
  fixed4-walker)  # Walker2d-v5 fixed:4 over 200 rounds spends fixed:8's 100-round bill (as Hopper's -r200)
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Walker2d-v5 --schemes fixed:4 --rounds 200 --seed-list "$seed" --name protocol-walker2d-v5-ppo-tuned-r200
    done ;;
  fixed16-grow)  # fixed:16 first on Hopper: its policy-gradient noise scales are what kappa is fitted on
    for env in Hopper-v5 Walker2d-v5; do
      if [ "$env" = Hopper-v5 ]; then stop=0.0044680 rates=docs/results/evidence/hopper-v5-ppo-tuned-rates.json
      else stop=0.0098110 rates=docs/results/evidence/walker2d-v5-ppo-tuned-rates.json; fi
      slug=$(echo "$env" | tr 'A-Z' 'a-z')
      for seed in 0 1 2 3 4 5 6 7 8 9; do
        grid --env "$env" --schemes fixed:16 --rounds 400 --i-min 4 --seed-list "$seed" --stop-at-reference-usd $stop \
          --rates $rates --name protocol-$slug-ppo-tuned-fixed16
      done
      for seed in 0 1 2 3 4 5 6 7 8 9; do
        grid --env "$env" --schemes grow --rounds 130 --i-min 4 --grow-f1 0.55 --grow-f2 0.87 --seed-list "$seed" \
          --stop-at-reference-usd $stop --rates $rates --name protocol-$slug-ppo-tuned-grow
      done
    done ;;
  fixed16-hopper)  # what kappa is fitted on, alone
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Hopper-v5 --schemes fixed:16 --rounds 400 --i-min 4 --seed-list "$seed" --stop-at-reference-usd 0.0044680 \
        --rates docs/results/evidence/hopper-v5-ppo-tuned-rates.json --name protocol-hopper-v5-ppo-tuned-fixed16
    done ;;
  noise)  # KAPPA: the value `python -m experiments sequential --fit-kappa` printed (docs/results.md)
    KAPPA=${KAPPA:?set KAPPA to the fitted kappa}
    for env in Hopper-v5 Walker2d-v5; do
      if [ "$env" = Hopper-v5 ]; then stop=0.0044680 rates=docs/results/evidence/hopper-v5-ppo-tuned-rates.json
      else stop=0.0098110 rates=docs/results/evidence/walker2d-v5-ppo-tuned-rates.json; fi
      slug=$(echo "$env" | tr 'A-Z' 'a-z')
      for scheme in noise noise-adascale noise-replay; do  # noise-replay replays seed s XOR 1's noise run
        for seed in 0 1 2 3 4 5 6 7 8 9; do
          grid --env "$env" --schemes $scheme --kappa "$KAPPA" --rounds 400 --i-min 4 --seed-list "$seed" \
            --stop-at-reference-usd $stop --rates $rates --name protocol-$slug-ppo-tuned-noise
        done
      done
    done ;;
  grow-walker16)  # the rest of fixed16-grow after fixed16-hopper
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Hopper-v5 --schemes grow --rounds 130 --i-min 4 --grow-f1 0.55 --grow-f2 0.87 --seed-list "$seed" \
        --stop-at-reference-usd 0.0044680 --rates docs/results/evidence/hopper-v5-ppo-tuned-rates.json \
        --name protocol-hopper-v5-ppo-tuned-grow
    done
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Walker2d-v5 --schemes fixed:16 --rounds 400 --i-min 4 --seed-list "$seed" --stop-at-reference-usd \
        0.0098110 --rates docs/results/evidence/walker2d-v5-ppo-tuned-rates.json --name protocol-walker2d-v5-ppo-tuned-fixed16
    done
    for seed in 0 1 2 3 4 5 6 7 8 9; do
      grid --env Walker2d-v5 --schemes grow --rounds 130 --i-min 4 --grow-f1 0.55 --grow-f2 0.87 --seed-list "$seed" \
        --stop-at-reference-usd 0.0098110 --rates docs/results/evidence/walker2d-v5-ppo-tuned-rates.json \
        --name protocol-walker2d-v5-ppo-tuned-grow
    done ;;
  *) echo "unknown PART $PART"; exit 2 ;;
esac
