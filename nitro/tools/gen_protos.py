"""Regenerate the Python gRPC code for protos/ into nitro/v1/ (run: `make protos`).

`--check` regenerates into a temporary directory and exits non-zero when the
committed code differs (the suite runs this so stale generated code fails CI).
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("nitro") / "v1"


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(PROTO_ROOT.glob("nitro/v1/*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *map(str, protos)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    init = out_dir / PACKAGE_DIR / "__init__.py"
    init.write_text('"""Generated gRPC contracts (package nitro.v1). Regenerate with `make protos`."""\n')
    return sorted((out_dir / PACKAGE_DIR).iterdir())


def main(argv: list[str]) -> int:
    if "--check" in argv:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = generate(Path(tmp))
            stale = [f.name for f in fresh if f.is_file() and not (
                (ROOT / PACKAGE_DIR / f.name).exists() and filecmp.cmp(f, ROOT / PACKAGE_DIR / f.name, shallow=False))]
        if stale:
            print(f"generated code is stale: {stale}; run `make protos`", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    for f in generate(ROOT):
        print(f"wrote {f.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
