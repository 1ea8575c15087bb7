"""``python -m llm_onnx.kernels build|info``: build the kernel library, or say where it is and
which instruction-set paths this CPU gets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_onnx import kernels
from llm_onnx.errors import KernelsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_onnx.kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the library into the cache folder")
    b.add_argument("--force", action="store_true", help="build again even if one is there")
    b.add_argument("--include-dir", type=Path, help="ONNX Runtime's headers (else ORT_INCLUDE_DIR"
                   " or the usual places)")
    b.add_argument("--verbose", action="store_true", help="show CMake's and the compiler's output")
    sub.add_parser("info", help="where the library is and which paths this CPU runs")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            from llm_onnx.kernels.build import build

            print(build(force=args.force, include_dir=args.include_dir, verbose=args.verbose))
        else:
            path = kernels.require()
            print(f"library: {path}\nops version: {kernels.ops_version(path)}\n"
                  f"instruction sets: {', '.join(kernels.supported_isas(path))}")
    except KernelsError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
