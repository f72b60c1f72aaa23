"""Where a model replica's CPU goes under load: py-spy samples of the replica while perf_analyzer runs.

``python -m bench.profile_replica [--tree PATH] [--protocol http|grpc] [--concurrency 8]
[--elements 16]`` serves the bench's ``identity_py`` model (from the working tree, or from ``--tree``,
another checkout such as the ``revisions`` scenario's base worktree; with ``--elements`` its FP32
tensors resized, e.g. 262144 for 1 MiB), finds the model's replica process, and samples it with
``py-spy`` while perf_analyzer holds the load. It writes the collapsed stacks (``stacks.txt``, the
input of any flame-graph tool) and ``table.json``: for each function, the share of the replica's
samples in which it is running (self) and on the stack (inclusive), busiest first, with the sample
count and the throughput perf_analyzer measured meanwhile. Two runs (head and base) side by side
show which function a change made dearer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench import peers
from bench.cpu_split import take_snapshot
from bench.pa_csv import read_perf_analyzer_csv
from bench.scenarios.common import (
    BENCH_MODELS,
    ConfigEdit,
    free_port,
    make_repository,
    start_this_server,
    work_dir,
)
from repository_loader.proto import model_config_pb2

MODEL = "identity_py"
REPLICA_MARK = f"ServeReplica:model-{MODEL}"


def replica_pid() -> int:
    """The pid of the model's replica (the one process whose command line carries its mark)."""
    found = [pid for pid, cmd in take_snapshot().cmdlines.items() if REPLICA_MARK in cmd]
    if len(found) != 1:
        raise RuntimeError(f"expected one replica of {MODEL}, found {found}")
    return found[0]


def resized(elements: int) -> ConfigEdit | None:
    """An edit giving the model's inputs and outputs ``elements`` values each (None: as shipped)."""
    if elements == 16:
        return None

    def edit(config: model_config_pb2.ModelConfig) -> None:
        for tensor in (*config.input, *config.output):
            del tensor.dims[:]
            tensor.dims.append(elements)

    return edit


def samples(stacks: str) -> Iterator[tuple[list[str], int]]:
    """Each line of collapsed ``stacks`` (``a;b;c count``) as its frames, outermost first, and count."""
    for line in stacks.splitlines():
        frames, _, count_text = line.rpartition(" ")
        if frames and count_text.isdigit():
            yield frames.split(";"), int(count_text)


def table(stacks: str, top: int = 60) -> list[dict[str, object]]:
    """Self and inclusive shares of each function over the collapsed ``stacks`` (``a;b;c count``)."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    total = 0
    for frames, count in samples(stacks):
        total += count
        names = [_short(f) for f in frames]
        own[names[-1]] += count
        for name in set(names):
            anywhere[name] += count
    rows = [
        {"function": name, "inclusive": anywhere[name] / total, "self": own[name] / total}
        for name, _ in anywhere.most_common(top)
    ]
    return [{"samples": total}, *rows]


# Where a sample's time goes: the deepest frame whose file is a layer's decides (a standard-library frame,
# json or asyncio, counts for the layer that called it); a socket write's own frame is the kernel's send.
# py-spy names files relative to their import root: the model's own file is ``model.py`` (a file mark
# matches that name alone, a folder mark a folder of that name anywhere in the path).
SOCKET_LAYER = "socket send (the kernel's TCP path, HAProxy's end included)"
HTTP_SERVER_LAYER = "HTTP/1.1 server (uvicorn or the replica's own, on httptools)"
_OWN_SERVER = "deployments/protocol/http1_server.py"
LAYERS: tuple[tuple[str, str], ...] = (
    ("model's execute (its model.py)", "model.py:"),
    ("Python backend (pb_utils objects, execute hand-off)", "deployments/backends/"),
    ("runtime (scheduling, checks, statistics)", "deployments/runtime/"),
    (HTTP_SERVER_LAYER, _OWN_SERVER),
    ("protocol (parse, decode, encode, respond)", "deployments/protocol/"),
    ("replica glue (ingress, response writes)", "deployments/serve/"),
    (HTTP_SERVER_LAYER, "uvicorn/"),
    ("Ray and Serve in the replica", "ray/"),
)
IDLE_LAYER = "event loop and other threads (uvloop's C loop, idle waits)"


def layers(stacks: str) -> dict[str, float]:
    """The share of samples in the socket send, each of :data:`LAYERS`, and :data:`IDLE_LAYER`."""
    counts: Counter[str] = Counter()
    total = 0
    for frames, count in samples(stacks):
        total += count
        counts[_layer(frames)] += count
    names = list(dict.fromkeys([SOCKET_LAYER, *(name for name, _ in LAYERS), IDLE_LAYER]))
    return {name: counts[name] / total for name in names} if total else {}


def _layer(frames: list[str]) -> str:
    name, _, path = frames[-1].partition(" (")
    method = name.rsplit(".", 1)[-1]
    if (path.startswith("deployments/serve/response_writes.py") and method in ("write", "writelines")) or (
        path.startswith(_OWN_SERVER) and method == "_flush"
    ):
        return SOCKET_LAYER
    for frame in reversed(frames):
        path = frame.partition(" (")[2]
        for layer, mark in LAYERS:
            if path.startswith(mark) or (mark.endswith("/") and f"/{mark}" in path):
                return layer
    return IDLE_LAYER


def _short(frame: str) -> str:
    """``function (path/to/file.py:line)`` as ``function (file.py)``: lines vary between revisions."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(file).parts
    return f"{name} ({'/'.join(parts[-2:])})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None, help="another checkout whose server to profile")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--elements", type=int, default=16, help="FP32 values per tensor (as shipped: 16)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    work = work_dir("profile_replica")
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, resized(args.elements))])
    args.out.mkdir(parents=True, exist_ok=True)
    handle = start_this_server(
        repo, free_port(), grpc_port=free_port(), log_path=work / "server.log", tree=args.tree
    )
    with handle, tempfile.TemporaryDirectory() as tmp:
        url = handle.url if args.protocol == "http" else f"localhost:{handle.grpc_port}"
        csv_path = Path(tmp) / "pa.csv"
        window_ms = 1000 * (args.seconds + 6) // 3  # three windows cover the sampling
        load = subprocess.Popen(
            peers.perf_analyzer_cmd(
                MODEL,
                url,
                [args.concurrency],
                protocol=args.protocol,
                csv_path=csv_path,
                measurement_interval_ms=window_ms,
                stability_percentage=100,
                max_trials=3,
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)  # past perf_analyzer's warm-up
        pid = replica_pid()
        stacks = subprocess.run(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(args.seconds),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(args.out / "stacks.txt"),
            ],
            capture_output=True,
            text=True,
        )
        if stacks.returncode != 0:
            print(stacks.stderr[-2000:], file=sys.stderr)
            return 1
        load.wait(timeout=120)
        points = read_perf_analyzer_csv(csv_path, MODEL, 1)
    rows = table((args.out / "stacks.txt").read_text())
    summary = {
        "command": " ".join(sys.argv),
        "tree": str(args.tree or "working tree"),
        "protocol": args.protocol,
        "concurrency": args.concurrency,
        "elements": args.elements,
        "infer_per_s": points[-1].infer_per_s if points else None,
        "layers": layers((args.out / "stacks.txt").read_text()),
        "rows": rows,
    }
    (args.out / "table.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["rows"][:25], indent=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
