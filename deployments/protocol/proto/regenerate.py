"""Regenerate ``grpc_service_pb2.py`` and ``grpc_service_pb2.pyi`` from ``grpc_service.proto``.

Run ``python -m deployments.protocol.proto.regenerate`` after editing the schema;
the generated files are committed. ``--out DIR`` writes them under ``DIR``
instead (a test uses that to check the committed files have not drifted).

The messages live in package ``inference``, as Triton's do, so a process that
also imports ``tritonclient`` would hold two definitions of
``inference.ModelInferRequest``. The generated module therefore registers its
file in a descriptor pool of its own (``POOL``) instead of protobuf's default
pool; the one line that picks the pool is rewritten after ``protoc`` runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PROTO_DIR.parent.parent.parent
PROTO_FILE = PROTO_DIR / "grpc_service.proto"
GENERATED = ("grpc_service_pb2.py", "grpc_service_pb2.pyi")

_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile("


def generate(out_dir: Path) -> list[Path]:
    """Compile the schema into ``out_dir`` and return the generated files."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        relative = PROTO_FILE.relative_to(PROJECT_ROOT).as_posix()
        args = ["protoc", f"-I{PROJECT_ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", relative]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {relative}")
        produced = Path(tmp) / PROTO_DIR.relative_to(PROJECT_ROOT)
        written = []
        for name in GENERATED:
            text = (produced / name).read_text()
            if name.endswith(".py"):
                if text.count(_DEFAULT_POOL) != 1:
                    raise RuntimeError(f"{name}: protoc's output no longer registers its file as expected")
                text = text.replace(_DEFAULT_POOL, _OWN_POOL)
            target = out_dir / name
            target.write_text(text)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="folder for the generated files")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
