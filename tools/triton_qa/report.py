"""``results.json`` and ``README.md`` of a conformance session (``bench/results/conformance/``)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.triton_qa.junit import TestOutcome
from tools.triton_qa.runner import REFERENCE, THIS, RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results" / "conformance"


@dataclass
class RunRecord:
    """One run of one suite on both servers."""

    suite: str
    label: str
    test_file: str
    results: dict[str, RunResult]
    skipped_models: list[tuple[str, str]] = field(default_factory=list)

    def test_ids(self) -> list[str]:
        """Every test id seen on either server, in first-seen order."""
        seen: dict[str, None] = {}
        for result in self.results.values():
            for outcome in result.outcomes:
                seen.setdefault(outcome.test_id, None)
        return list(seen)

    def passed(self, server: str) -> int | None:
        """How many tests passed on ``server`` (``None``: not run there)."""
        result = self.results.get(server)
        if result is None:
            return None
        return sum(o.status == "passed" for o in result.outcomes)


def git_commit(path: Path = REPO_ROOT) -> str:
    """The commit checked out at ``path`` (``unknown`` outside git)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def load_reference(paths: list[Path]) -> dict[tuple[str, str], tuple[RunResult, dict[str, str]]]:
    """tritonserver's results per ``(suite, run label)`` from earlier sessions' ``results.json`` files
    (the first file that ran a run wins), each with where it came from (path, commit, start)."""
    found: dict[tuple[str, str], tuple[RunResult, dict[str, str]]] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        source = {"path": str(path), "commit": doc.get("commit", ""), "started": doc.get("started", "")}
        for run in doc.get("runs", []):
            ref = run.get("servers", {}).get(REFERENCE)
            key = (run["suite"], run["label"])
            if ref is None or key in found:
                continue
            result = RunResult(
                REFERENCE,
                outcomes=[
                    TestOutcome(test_id, o["status"], o.get("message", ""))
                    for test_id, o in ref.get("outcomes", {}).items()
                ],
                error=ref.get("error", ""),
                seconds=float(ref.get("seconds", 0.0)),
                dropped_args=list(ref.get("dropped_args", [])),
                not_ready=list(ref.get("models_not_ready", [])),
            )
            found[key] = (result, source)
    return found


def _outcome_map(outcomes: list[TestOutcome]) -> dict[str, dict[str, Any]]:
    return {o.test_id: {"status": o.status, "message": o.message} for o in outcomes}


def to_json(
    records: list[RunRecord], meta: dict[str, Any], cannot_run: list[dict[str, str]]
) -> dict[str, Any]:
    """The session as one JSON-ready document."""
    runs = []
    for rec in records:
        servers = {
            name: {
                "error": res.error,
                "seconds": round(res.seconds, 1),
                "dropped_args": res.dropped_args,
                "models_not_ready": res.not_ready,
                "passed": rec.passed(name),
                "tests": len(res.outcomes),
                "outcomes": _outcome_map(res.outcomes),
            }
            for name, res in rec.results.items()
        }
        runs.append(
            {
                "suite": rec.suite,
                "label": rec.label,
                "test_file": rec.test_file,
                "tests": len(rec.test_ids()),
                "skipped_models": [{"model": m, "why": w} for m, w in rec.skipped_models],
                "servers": servers,
            }
        )
    return {**meta, "runs": runs, "cannot_run": cannot_run}


def _cell(rec: RunRecord, server: str) -> str:
    passed = rec.passed(server)
    if passed is None:
        return "not run"
    result = rec.results[server]
    if result.error and not result.outcomes:
        return "error"
    return str(passed)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: dict[str, Any], records: list[RunRecord]) -> str:
    """The README: the pass table, this server's failures, what cannot run here."""
    lines = [
        "# Triton qa conformance",
        "",
        "Triton's own qa tests (from a checkout of its server repository) run against tritonserver 2.51",
        "and against this server on the same model repository. Written by `python -m tools.triton_qa`;",
        "see `docs/conformance.md`.",
        "",
        f"- command: `{doc.get('command', '')}`",
        f"- commit: `{doc.get('commit', '')}`",
        f"- Triton checkout: `{doc.get('triton_checkout', '')}` ({doc.get('triton_ref', 'unknown')})",
        f"- run time: {doc.get('seconds', 0):.0f} s",
        f"- both servers started with: `{' '.join(doc.get('common_server_args', []))}`",
        *[
            f"- tritonserver's column read from `{src['path']}` (run at commit `{src['commit'][:9]}`,"
            f" {src['started']}): the same checkout and tritonserver, not run again"
            for src in doc.get("reference_from", [])
        ],
        "",
        "| suite | test file | tests | passed on tritonserver | passed on this server |",
        "|---|---|---:|---:|---:|",
    ]
    for rec in records:
        name = rec.test_file if Path(rec.test_file).stem == rec.label else f"{rec.test_file} ({rec.label})"
        lines.append(
            f"| {rec.suite} | {name} | {len(rec.test_ids())} | {_cell(rec, REFERENCE)} | {_cell(rec, THIS)} |"
        )
    lines += ["", "## Tests that do not pass on this server", ""]
    any_failure = False
    for rec in records:
        this = rec.results.get(THIS)
        if this is None:
            continue
        ref = (
            {o.test_id: o.status for o in rec.results[REFERENCE].outcomes} if REFERENCE in rec.results else {}
        )
        bad = [o for o in this.outcomes if o.status not in ("passed", "skipped")]
        if not bad and not this.error:
            continue
        any_failure = True
        lines.append(f"### {rec.suite} / {rec.test_file}")
        lines.append("")
        if this.error:
            lines.append(f"- run error: {_md_escape(this.error)}")
        for o in bad:
            on_ref = ref.get(o.test_id)
            note = f" (tritonserver: {on_ref})" if on_ref else ""
            lines.append(f"- `{o.test_id}` {o.status}{note}: {_md_escape(o.message)}")
        lines.append("")
    if not any_failure:
        lines += ["None.", ""]
    lines += ["## Dropped flags, unbuilt models, models not ready", ""]
    for rec in records:
        dropped = sorted({a for r in rec.results.values() for a in r.dropped_args})
        if dropped:
            lines.append(f"- {rec.suite} / {rec.label}: this server has no flag for `{' '.join(dropped)}`")
        for name, res in rec.results.items():
            for line in res.not_ready:
                lines.append(f"- {rec.suite} / {rec.label}: on {name}, model not ready: {_md_escape(line)}")
        for model, why in rec.skipped_models:
            lines.append(f"- {rec.suite} / {rec.label}: model `{model}` not built: {_md_escape(why)}")
    lines += ["", "## Cannot run here", ""]
    for item in doc.get("cannot_run", []):
        lines.append(f"- {item['suite']}: {_md_escape(item['what'])} — {_md_escape(item['why'])}")
    lines.append("")
    return "\n".join(lines)


def write_results(
    records: list[RunRecord], meta: dict[str, Any], cannot_run: list[dict[str, str]], out: Path = RESULTS_DIR
) -> Path:
    """Write ``results.json`` and ``README.md`` into ``out``; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    doc = to_json(records, meta, cannot_run)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "README.md").write_text(to_markdown(doc, records))
    return out
