"""Regenerate the committed protobuf/gRPC code from proto/ (run after editing a .proto).

Usage: python tools/gen_proto.py [OUT_DIR]   (default: the repository root)
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
# Only service.proto declares services; the others get no *_pb2_grpc.py.
SERVICE_PROTOS = {"service.proto"}


def generate(out_dir: Path) -> list[Path]:
    """Generate *_pb2.py, *_pb2.pyi and, for service files, *_pb2_grpc.py under out_dir."""
    protos = sorted((PROTO_DIR / "starpulse" / "v1").glob("*.proto"))
    (out_dir / "starpulse" / "v1").mkdir(parents=True, exist_ok=True)
    for proto in protos:
        rel = proto.relative_to(PROTO_DIR).as_posix()
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
        if proto.name in SERVICE_PROTOS:
            args.append(f"--grpc_python_out={out_dir}")
        include = Path(protoc.__file__).parent / "_proto"
        args += [f"-I{include}", rel]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {rel}")
    return sorted((out_dir / "starpulse" / "v1").glob("*_pb2*.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(target):
        print(path)
