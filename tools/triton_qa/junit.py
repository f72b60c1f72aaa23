"""Per-test outcomes from a pytest ``--junitxml`` report."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

STATUSES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class TestOutcome:
    """One test case: ``test_id`` is ``module.Class.method``; ``message`` the failure's first line."""

    __test__ = False  # not a pytest class, whatever its name

    test_id: str
    status: str
    message: str = ""
    seconds: float = 0.0


def first_line(text: str | None, limit: int = 300) -> str:
    """The first non-empty line of ``text``, at most ``limit`` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def parse_junit_text(xml_text: str) -> list[TestOutcome]:
    """The test cases of a junit XML document, in the order they ran."""
    root = ET.fromstring(xml_text)
    outcomes: list[TestOutcome] = []
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        test_id = f"{classname}.{name}" if classname else name
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = first_line(node.get("message")) or first_line(node.text)
                break
        outcomes.append(TestOutcome(test_id, status, message, float(case.get("time", "0") or 0)))
    return outcomes


def parse_junit(path: Path) -> list[TestOutcome]:
    """:func:`parse_junit_text` of the file at ``path`` (a broken file gives no outcomes)."""
    try:
        return parse_junit_text(path.read_text(errors="replace"))
    except ET.ParseError:
        return []
