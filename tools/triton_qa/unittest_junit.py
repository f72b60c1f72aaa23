"""Run a unittest file the way ``python test.py`` does and write a junit XML report of it.

Triton's ``TestResultCollector`` base class needs unittest's own runner (pytest's result object lacks
``testsRun``), so the runner uses this instead of pytest for such files:
``python -m tools.triton_qa.unittest_junit --junit out.xml test_file.py [Class.method ...]``.

A test file that is a plain script (``L0_sequence_stress``' ``sequence_stress.py``: ``test.sh`` runs it and
reads its exit status) runs with ``--script``: one test case, ``<file>.main``, passed when it exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
import unittest
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

ErrInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def error_line(err: ErrInfo) -> str:
    """``Type: message`` (first line) of an exception triple."""
    exc_type, exc, _ = err
    if exc_type is None:
        return ""
    text = str(exc).strip().splitlines()
    return f"{exc_type.__name__}: {text[0] if text else ''}".strip()[:300]


class JunitResult(unittest.TextTestResult):
    """A text result that also keeps ``test id -> (status, message, seconds)``, and writes them to
    ``report_to`` after each test (a run stopped for its time limit still reports the tests it finished)."""

    report_to: Path | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cases: dict[str, list[Any]] = {}
        self._started: dict[str, float] = {}

    def _set(self, test: unittest.TestCase, status: str, message: str = "") -> None:
        case = self.cases.setdefault(test.id(), ["passed", "", 0.0])
        if case[0] in ("failed", "error") and status == "passed":
            return  # a failed subtest keeps its test failed
        case[0], case[1] = status, message
        case[2] = time.monotonic() - self._started.get(test.id(), time.monotonic())

    def startTest(self, test: unittest.TestCase) -> None:
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        if self.report_to is not None:
            self.report_to.write_text(junit_xml(self.cases))

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._set(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._set(test, "failed", error_line(err))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._set(test, "error", error_line(err))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._set(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._set(test, "passed")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._set(test, "failed", "unexpected success")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._set(test, "failed" if failed else "error", f"{subtest.id()}: {error_line(err)}")


def keep_python310_outcome_api() -> None:
    """``TestCase._feedErrorsToResult`` and ``_Outcome.errors`` as Python 3.10 had them, for tests written
    for it (``L0_model_update``'s ``tearDown`` reads them to see whether its test failed). Python 3.11
    reports each error to the result at once, so ``errors`` lists the result's errors and failures so far."""
    outcome = unittest.case._Outcome  # type: ignore[attr-defined]
    if not hasattr(outcome, "errors"):
        outcome.errors = property(lambda self: list(self.result.errors) + list(self.result.failures))
    if not hasattr(unittest.TestCase, "_feedErrorsToResult"):

        def feed(self: unittest.TestCase, result: unittest.TestResult, errors: list[Any]) -> None:
            result.errors.extend(errors)

        unittest.TestCase._feedErrorsToResult = feed  # type: ignore[attr-defined]


def keep_numpy1_aliases() -> None:
    """NumPy 1's aliases that NumPy 2 removed, for tests written against NumPy 1 (``L0_nan_inf`` builds
    its expected output with ``np.NINF``): the server's own restore, for Python models
    (``deployments.backends.python_api.numpy1``)."""
    from deployments.backends.python_api import numpy1

    numpy1.restore()


def junit_xml(cases: dict[str, list[Any]]) -> str:
    """The cases as a junit document (``classname`` = the id less its last part)."""
    suite = ET.Element("testsuite", name="unittest", tests=str(len(cases)))
    for test_id, (status, message, seconds) in cases.items():
        classname, _, name = test_id.rpartition(".")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(status)
        if tag:
            ET.SubElement(case, tag, message=message)
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode")


def run_script(path: Path, junit: Path) -> int:
    """``python <path>`` in its folder, its output passed through; one case that passes on exit 0, else
    fails with the script's last output line."""
    started = time.monotonic()
    process = subprocess.run(
        [sys.executable, str(path)],
        cwd=path.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sys.stdout.write(process.stdout)
    lines = [line for line in process.stdout.splitlines() if line.strip()]
    message = (
        "" if process.returncode == 0 else f"exit status {process.returncode}: {lines[-1] if lines else ''}"
    )
    status = "passed" if process.returncode == 0 else "failed"
    junit.write_text(junit_xml({f"{path.stem}.main": [status, message[:300], time.monotonic() - started]}))
    return process.returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--junit", type=Path, required=True)
    parser.add_argument("--script", action="store_true", help="the file is a script: pass on exit status 0")
    parser.add_argument("test_file")
    parser.add_argument("tests", nargs="*")
    args = parser.parse_args(argv)
    path = Path(args.test_file).resolve()
    if args.script:
        return run_script(path, args.junit)
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path)]
    keep_numpy1_aliases()
    module = importlib.import_module(path.stem)
    loader = unittest.TestLoader()
    suite = (
        loader.loadTestsFromNames(args.tests, module) if args.tests else loader.loadTestsFromModule(module)
    )
    JunitResult.report_to = args.junit
    keep_python310_outcome_api()
    runner = unittest.TextTestRunner(resultclass=JunitResult, verbosity=2)
    result = runner.run(suite)
    assert isinstance(result, JunitResult)
    args.junit.write_text(junit_xml(result.cases))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
