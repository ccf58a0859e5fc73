"""python -m experiments FIGURE [--seeds N] [--rounds N]

Figures of the paper's evaluation: fig10, fig11, fig15, fig17, fig18, fig20 (experiments/figures.py).
The evaluation protocol (experiments/protocol.py; `python -m experiments protocol --help`):
protocol (paper scale, every control beside nitro), protocol-budget (the same with a budget on the measured
cloud clock) and protocol-equal-cost (finished grids compared at equal dollars at fixed reference rates,
experiments/equal_cost.py) and protocol-versus (one job's grids under two settings, scheme against scheme,
experiments/versus.py).
The sequential experiment of issue 40 (experiments/sequential.py; `python -m experiments sequential --help`):
the evidence-based scaling policies against the best fixed count.
The signal test (experiments/signal.py; `python -m experiments signal --help`): which round-level signal
predicts what boosting a round buys.
"""

import argparse
import inspect
import sys

from experiments.figures import FIGURES

PROTOCOL_FIGURES = ("protocol", "protocol-budget")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "signal":
        from experiments.signal import main as signal_main

        sys.exit(signal_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "protocol-equal-cost":
        from experiments.equal_cost import main as equal_cost_main

        sys.exit(equal_cost_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "sequential":
        from experiments.sequential import main as sequential_main

        sys.exit(sequential_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "protocol-versus":
        from experiments.versus import main as versus_main

        sys.exit(versus_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] in PROTOCOL_FIGURES:
        from experiments.protocol import main as protocol_main

        sys.exit(protocol_main(sys.argv[1], sys.argv[2:]))
    p = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", choices=sorted(FIGURES) + list(PROTOCOL_FIGURES)
                   + ["protocol-equal-cost", "protocol-versus", "sequential", "signal"])
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args()
    fn = FIGURES[args.figure]
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in (("seeds", args.seeds), ("rounds", args.rounds)) if v is not None and k in params}
    fn(**kwargs)


if __name__ == "__main__":
    main()
