"""Start each server on a run's repository, run the suite's test file against it, and stop the server.

Triton's tests talk to ``localhost:8000`` (HTTP), ``8001`` (gRPC) and ``8002`` (metrics), so one server
runs at a time on those ports. The servers are started with the project's helpers (``bench.peers`` for
``tritonserver``, ``bench.scenarios.common`` for this server) and stopped through their process group.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers import PeerSetupError, ServerHandle, start_tritonserver
from bench.scenarios.common import start_this_server
from deployments.serve.request_path import instance_ports_env
from tools.triton_qa.junit import TestOutcome, parse_junit
from tools.triton_qa.models import build_model, build_repository
from tools.triton_qa.suites import Run, Suite

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "harness"  # stand-ins for modules the qa build compiles
RESTRICT = Path(__file__).resolve().parent / "restrict"  # test_util with some backends' validators off
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
REFERENCE, THIS = "tritonserver", "this server"
# both servers: a model one of them cannot load fails its tests, not the whole run
COMMON_TRITON_ARGS = ("--strict-readiness=false",)
QA_PORT_BLOCK = 4  # HAProxy's and the replicas' ports of this server (benchmarks: 3, test servers: 2)
START_ATTEMPTS = 2  # a server that fails to start is started once more before its tests are failed
# tritonserver flags with another spelling here: flag -> (value -> this server's arguments)
_RENAMED: dict[str, dict[str, list[str]]] = {
    "--strict-readiness": {"false": ["--strict-readiness", "false"], "true": ["--strict-readiness", "true"]},
    "--strict-model-config": {"true": ["--disable-auto-complete-config"], "false": []},
}
# a run's argument for this server only (``this:--flag``): tritonserver has no such flag
THIS_ONLY = "this:"


def this_server_options() -> dict[str, int]:
    """This server's ``serve`` flags and how many values each takes (read from its own parser)."""
    from deployments.serve.cli import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    options: dict[str, int] = {}
    for action in serve._actions:
        for opt in action.option_strings:
            options[opt] = 0 if action.nargs == 0 else 1
    return options


def split_flag(arg: str) -> tuple[str, str | None]:
    """``--name=value`` as ``("--name", "value")``; ``--name`` as ``("--name", None)``."""
    name, sep, value = arg.partition("=")
    return name, (value if sep else None)


def translate_args(triton_args: Sequence[str], options: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """tritonserver's ``--flag=value`` arguments as this server's, and the ones it has no flag for."""
    kept: list[str] = []
    dropped: list[str] = []
    for arg in triton_args:
        arg = arg.removeprefix(THIS_ONLY)
        name, value = split_flag(arg)
        if name in _RENAMED and value is not None and value.lower() in _RENAMED[name]:
            kept += _RENAMED[name][value.lower()]
        elif name in options and options[name] == 0:
            if value is None or value.lower() in ("1", "true", "on"):
                kept.append(name)
        elif name in options and value is not None:
            kept += [name, value]
        else:
            dropped.append(arg)
    return kept, dropped


@dataclass
class RunResult:
    """One run's outcomes on one server."""

    server: str
    outcomes: list[TestOutcome] = field(default_factory=list)
    error: str = ""  # the server did not start, or the tests did not report
    seconds: float = 0.0
    dropped_args: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)  # models not READY once the server answered ready


@dataclass
class Workspace:
    """Where a session works: a copy of the checkout's ``qa`` folder, repositories, logs, generated models."""

    checkout: Path
    root: Path

    @property
    def qa(self) -> Path:
        return self.root / "qa"

    @property
    def cache(self) -> Path:
        return self.root / "generated"

    def prepare(self) -> None:
        """Copy the checkout's ``qa`` folder (tests write files next to themselves)."""
        if self.qa.exists():
            shutil.rmtree(self.qa)
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.checkout / "qa", self.qa, symlinks=True)

    def slot(self, suite: Suite, run: Run) -> Path:
        """A folder of a run's own, for its repository, logs and reports."""
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in run.label)
        path = self.root / "runs" / suite.name / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def start_server(
    which: str, repo: Path, triton_args: Sequence[str], env: Mapping[str, str], log_path: Path
) -> tuple[ServerHandle, list[str]]:
    """Start ``which`` server on ``repo`` with tritonserver's flags ``triton_args`` (translated for this
    server); returns its handle and the flags it was started without."""
    if which == REFERENCE:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # start_tritonserver passes this process's environment on
        ours = [a for a in triton_args if not a.startswith(THIS_ONLY)]
        try:
            handle = start_tritonserver(
                repo, HTTP_PORT, GRPC_PORT, METRICS_PORT, log_path=log_path, extra=ours
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return handle, []
    args, dropped = translate_args(triton_args, this_server_options())
    args += ["--metrics-port", str(METRICS_PORT), "--exit-on-error", "false"]
    env = {**instance_ports_env(QA_PORT_BLOCK), **env}  # a benchmark may run beside it
    if grpc_health_restricted(triton_args):
        # the start helper's gRPC probe (ServerLive) gets no answer without the header: wait for the port
        args += ["--grpc-port", str(GRPC_PORT)]
        handle = start_this_server(repo, HTTP_PORT, log_path=log_path, env=env, extra_args=args)
        wait_for_port(GRPC_PORT, handle)
    else:
        handle = start_this_server(
            repo, HTTP_PORT, grpc_port=GRPC_PORT, log_path=log_path, env=env, extra_args=args
        )
    return handle, dropped


def port_taken(port: int) -> bool:
    """Whether something accepts connections on ``localhost:port``."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_ports_free(ports: Sequence[int], timeout: float = 60.0) -> list[int]:
    """Wait until none of ``ports`` answers (a server just stopped may linger); returns those still taken.

    Without this a readiness probe can be answered by the previous server and the tests hit a dying one.
    """
    deadline = time.monotonic() + timeout
    while True:
        taken = [p for p in ports if port_taken(p)]
        if not taken or time.monotonic() > deadline:
            return taken
        time.sleep(0.5)


def grpc_health_restricted(triton_args: Sequence[str]) -> bool:
    """Whether the flags restrict gRPC's health protocol to requests with a header."""
    for arg in triton_args:
        name, value = split_flag(arg)
        if name.startswith("--grpc-restricted") and value and "health" in value.partition(":")[0].split(","):
            return True
    return False


def wait_for_port(port: int, handle: ServerHandle, timeout: float = 120.0) -> None:
    """Wait until ``localhost:port`` accepts connections; stop ``handle`` and raise if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.25)
    handle.stop()
    raise TimeoutError(f"port {port} did not open within {timeout:.0f} s")


def unittest_command(test_file: str, tests: Sequence[str], junit: Path) -> list[str]:
    """``test_file`` run by unittest's runner (as ``python test_file``), writing ``junit``."""
    return [sys.executable, "-m", "tools.triton_qa.unittest_junit", f"--junit={junit}", test_file, *tests]


def test_command(run: Run, tests: Sequence[str], junit: Path) -> list[str]:
    """The command that runs ``tests`` (all when empty) of ``run`` the way its ``test.sh`` does."""
    if run.runner == "pytest":
        return pytest_command(
            run.test_file, tests, junit, per_test_timeout=300, not_here=[t for t, _ in run.not_here]
        )
    if run.runner == "script":
        return [
            sys.executable,
            "-m",
            "tools.triton_qa.unittest_junit",
            f"--junit={junit}",
            "--script",
            run.test_file,
        ]
    return unittest_command(run.test_file, tests, junit)


def models_not_ready(save_to: Path) -> list[str]:
    """``name: state (reason)`` of each model the repository index shows not READY; saves the index."""
    request = urllib.request.Request(f"http://localhost:{HTTP_PORT}/v2/repository/index", data=b"{}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            index = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        return [f"(repository index unavailable: {exc})"]
    save_to.write_text(json.dumps(index, indent=2))
    return [
        f"{m.get('name')}: {m.get('state', '?')}" + (f" ({m['reason']})" if m.get("reason") else "")
        for m in index
        if m.get("state") != "READY"
    ]


def pytest_command(
    test_file: str,
    tests: Sequence[str],
    junit: Path,
    per_test_timeout: float,
    not_here: Sequence[str] = (),
) -> list[str]:
    """``pytest`` on ``test_file`` (only ``tests``: ``Class`` or ``Class.method``; never ``not_here``)
    writing ``junit``."""
    targets = [f"{test_file}::{t.replace('.', '::')}" for t in tests] or [test_file]
    deselect = [f"--deselect={test_file}::{t.replace('.', '::')}" for t in not_here]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rN",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        f"--timeout={int(per_test_timeout)}",
        *deselect,
        *targets,
    ]


def run_env(run: Run, qa: Path) -> dict[str, str]:
    """``run.env`` with ``{qa}`` in its values replaced by the work copy's ``qa`` folder (``test.sh``
    sets some variables to its own folder, which both the tests and the models read)."""
    return {k: v.replace("{qa}", str(qa)) for k, v in run.env.items()}


def test_env(ws: Workspace, run: Run, server_log: Path) -> dict[str, str]:
    """The test process's environment: ``qa/common`` and the harness stand-ins (``harness/``) on
    ``PYTHONPATH``, the run's variables, the log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    pythonpath = [str(ws.qa / "common"), str(HARNESS), str(PROJECT_ROOT), env.get("PYTHONPATH", "")]
    if run.only_backends:
        pythonpath.insert(0, str(RESTRICT))
        env["TRITON_QA_ONLY_BACKENDS"] = ",".join(run.only_backends)
    env["PYTHONPATH"] = os.pathsep.join(p for p in pythonpath if p)
    env.update(run_env(run, ws.qa))
    env["SERVER_LOG"] = str(server_log)
    return env


def run_tests(
    ws: Workspace, suite: Suite, run: Run, which: str, repo: Path, tests: Sequence[str]
) -> RunResult:
    """Start ``which`` server, run ``tests`` of ``run`` (all when empty) against it, stop it."""
    slot = ws.slot(suite, run)
    tag = "reference" if which == REFERENCE else "this"
    suffix = "-" + tests[0].replace(".", "-") if len(tests) == 1 and run.server_per_test else ""
    log_path = slot / f"server-{tag}{suffix}.log"
    junit = slot / f"junit-{tag}{suffix}.xml"
    junit.unlink(missing_ok=True)
    result = RunResult(which)
    started = time.monotonic()
    busy = wait_ports_free((HTTP_PORT, GRPC_PORT, METRICS_PORT))
    if busy:
        result.error = f"ports {busy} still taken by another process; not started"
        return result
    server_env = {**run_env(run, ws.qa), "SERVER_LOG": str(log_path)}
    for attempt in range(START_ATTEMPTS):
        try:
            args = (*COMMON_TRITON_ARGS, *(a.replace("{qa}", str(ws.qa)) for a in run.server_args))
            handle, result.dropped_args = start_server(which, repo, args, server_env, log_path)
            break
        except (PeerSetupError, TimeoutError, OSError) as exc:
            # a start that fails on a loaded machine (Ray's node or GCS timing out) gets one more try
            if attempt + 1 < START_ATTEMPTS and not wait_ports_free((HTTP_PORT, GRPC_PORT, METRICS_PORT)):
                continue
            result.error = f"{which} did not start: {str(exc).strip().splitlines()[0][:300]}"
            result.seconds = time.monotonic() - started
            return result
    named_log: Path | None = None
    try:
        result.not_ready = models_not_ready(slot / f"index-{tag}{suffix}.json")
        suite_dir = ws.qa / suite.name
        cmd = test_command(run, tests or run.tests, junit)
        named_log = link_server_log(suite_dir, run.server_log_name, log_path)
        with open(slot / f"client-{tag}{suffix}.log", "wb") as out:
            try:
                subprocess.run(
                    cmd,
                    cwd=suite_dir,
                    env=test_env(ws, run, log_path),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=run.timeout_s,
                )
            except subprocess.TimeoutExpired:
                result.error = f"the test process ran past {run.timeout_s:.0f} s"
    finally:
        handle.stop()
        if named_log is not None:
            named_log.unlink(missing_ok=True)
    if junit.exists():
        result.outcomes = parse_junit(junit)
    elif not result.error:
        result.error = "pytest wrote no report (see the client log)"
    result.seconds = time.monotonic() - started
    return result


def link_server_log(folder: Path, name: str, log_path: Path) -> Path | None:
    """``folder/name`` pointing at the server's log, as ``test.sh`` names it for the tests that open it."""
    if not name:
        return None
    link = folder / name
    link.unlink(missing_ok=True)
    link.symlink_to(log_path)
    return link


def repository_path(ws: Workspace, suite: Suite, run: Run) -> Path:
    """Where ``run``'s repository is laid out: the run's own folder, or the suite's folder of the work
    copy where ``test.sh`` puts it for tests that edit it (``run.repository_at``)."""
    if run.repository_at:
        return ws.qa / suite.name / run.repository_at
    return ws.slot(suite, run) / "models"


def run_both(
    ws: Workspace, suite: Suite, run: Run, servers: Sequence[str], only: Sequence[str] = ()
) -> tuple[dict[str, RunResult], list[tuple[str, str]]]:
    """Lay out ``run``'s repository and run it on each of ``servers`` in turn; also returns the models
    that could not be built. ``only``: test ids to keep (a run's ``server_per_test`` list)."""
    built = build_repository(run.models, ws.checkout, ws.cache, repository_path(ws, suite, run))
    results: dict[str, RunResult] = {}
    for n, which in enumerate(servers):
        if run.prepare is not None:  # its tests change the files: each server starts from test.sh's layout
            if n:
                built = build_repository(run.models, ws.checkout, ws.cache, built.path)
            run.prepare(ws.qa / suite.name, lambda m, folder: build_model(m, ws.checkout, ws.cache, folder))
        if run.server_per_test and run.tests:
            merged = RunResult(which)
            for test in [t for t in run.tests if not only or t in only]:
                part = run_tests(ws, suite, run, which, built.path, [test])
                merged.outcomes += part.outcomes
                merged.seconds += part.seconds
                merged.dropped_args = part.dropped_args
                if part.error:
                    merged.error = "; ".join(e for e in (merged.error, f"{test}: {part.error}") if e)
            results[which] = merged
        else:
            results[which] = run_tests(ws, suite, run, which, built.path, ())
        print(_summary(suite, run, results[which]), file=sys.stderr, flush=True)
    return results, built.skipped


def _summary(suite: Suite, run: Run, result: RunResult) -> str:
    passed = sum(o.status == "passed" for o in result.outcomes)
    note = f" ({result.error})" if result.error else ""
    return (
        f"== {suite.name} {run.label} on {result.server}: {passed}/{len(result.outcomes)} passed"
        f" in {result.seconds:.0f} s{note}"
    )
