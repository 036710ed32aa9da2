"""Generate the Python code for protos/cascade/v1/*.proto into cascade/v1/ (run from anywhere).

Generated files are committed; tests/test_protos.py fails when they are out of date.
Usage: python scripts/gen_protos.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"


def generate(out_dir: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    package = out_dir / "cascade" / "v1"
    (package / "__init__.py").write_text('"""Generated from protos/cascade/v1; do not edit."""\n')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT)
    generate(parser.parse_args().out)
