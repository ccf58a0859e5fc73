"""`nitro presets`: the algorithm and environment presets."""

from __future__ import annotations


def add_presets(sub) -> None:
    p = sub.add_parser("presets", help="list the algorithm and environment presets and what each sets",
                       description="One line per preset: algorithm presets (--preset with --algo) and environment "
                                   "presets (--preset alone).")
    p.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    from nitro.preset_catalog import lines

    print("\n".join(lines()))
    return 0
