"""Regenerate ``model_config_pb2.py`` and ``model_config_pb2.pyi`` from ``model_config.proto``.

Run ``python -m repository_loader.proto.regenerate`` after editing the schema;
the generated files are committed. ``--out DIR`` writes them under ``DIR``
instead (a test uses that to check the committed files have not drifted).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PROTO_DIR.parent.parent
PROTO_FILE = PROTO_DIR / "model_config.proto"
GENERATED = ("model_config_pb2.py", "model_config_pb2.pyi")


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
            target = out_dir / name
            shutil.copyfile(produced / name, target)
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
