"""python -m experiments FIGURE [--seeds N] [--rounds N]"""

import argparse
import inspect

from experiments.figures import FIGURES


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    p.add_argument("figure", choices=sorted(FIGURES))
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args()
    fn = FIGURES[args.figure]
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in (("seeds", args.seeds), ("rounds", args.rounds)) if v is not None and k in params}
    fn(**kwargs)


if __name__ == "__main__":
    main()
