"""``python -m bench summary --check``: every figure the READMEs cite is the one its saved result holds."""

import shutil
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from bench.summary import BENCH_README, README, RESULTS, ROOT, Sources, check, check_figure


def test_the_repository_figures_and_tables_match_the_saved_results():
    stale, _ = check()
    assert stale == []


def test_the_command_passes_on_the_repository_and_writes_nothing():
    before = (README.read_text(), (RESULTS / "SUMMARY.md").read_text())
    assert bench_main(["summary", "--check"]) == 0
    assert (README.read_text(), (RESULTS / "SUMMARY.md").read_text()) == before


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The README, bench/README.md and the saved results (without plots) in a temporary folder."""
    shutil.copy(README, tmp_path / "README.md")
    shutil.copytree(RESULTS, tmp_path / "bench" / "results", ignore=shutil.ignore_patterns("*.png", "*.csv"))
    shutil.copy(BENCH_README, tmp_path / "bench" / "README.md")
    return tmp_path


def _check(copy: Path) -> list[str]:
    stale, _ = check(copy / "bench" / "results", copy / "README.md", copy / "bench" / "README.md", ROOT)
    return stale


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_copy_passes_as_it_is(copy):
    assert _check(copy) == []


def test_a_stale_figure_is_named_with_the_file_it_should_match(copy):
    _edit(copy / "README.md", "0.77<!-- fig", "0.78<!-- fig")
    _edit(copy / "bench" / "README.md", "1.05–1.10<!--", "1.05–1.09<!--")
    stale = _check(copy)
    assert len(stale) == 2
    assert "0.78 should read 0.77 (bench/results/overhead/results.json: perf_analyzer:1:ratio)" in stale[0]
    assert stale[0].startswith("README.md:")
    assert stale[1].startswith("bench/README.md:") and "1.05–1.09 should read 1.05–1.10" in stale[1]


def test_a_figure_without_a_citation_is_caught(copy):
    _edit(
        copy / "README.md",
        "- On a trivial Python model",
        "- Half a claim, 0.99 of it. On a trivial Python model",
    )
    stale = _check(copy)
    assert len(stale) == 1 and "0.99 cites no result" in stale[0]


def test_a_citation_moved_off_its_figure_is_caught(copy):
    _edit(copy / "README.md", "0.40–0.58<!-- fig", "half to two thirds<!-- fig")
    stale = _check(copy)
    assert len(stale) == 1 and "follows no figure" in stale[0]


def test_a_figure_that_changed_in_the_results_is_caught(copy):
    path = copy / "bench" / "results" / "http_floor" / "results.json"
    _edit(path, '"server_cpu_ms_per_request": 0.036', '"server_cpu_ms_per_request": 0.046')
    stale = _check(copy)
    assert len(stale) == 1
    assert "0.036 should read 0.046 (bench/results/http_floor/results.json: server_cpu_ms)" in stale[0]


def test_tables_that_differ_from_the_saved_results_are_caught(copy):
    _edit(copy / "README.md", "| 1 | 4,003 | 3,073 | 0.77 |", "| 1 | 4,003 | 3,073 | 0.78 |")
    _edit(copy / "bench" / "results" / "SUMMARY.md", "| 1 | 4,003 |", "| 1 | 4,004 |")
    stale = _check(copy)
    assert any("README.md: the tables differ" in line for line in stale)
    assert any("SUMMARY.md: differs" in line for line in stale)


def test_ranges_globs_and_max_against_the_saved_limit_and_agreement():
    sources = Sources()
    assert check_figure("0.40", "0.58", "limit:*:*:fraction", sources) is None
    assert check_figure("1.06", "1.07", "agreement:tritonserver:{4,16}:ratio", sources) is None
    assert check_figure("0.1", None, "max agreement:*:*:count_gap_pct", sources) is None
    problem, kind = check_figure("0.50", None, "limit:*:*:fraction", sources)  # a range, not one figure
    assert kind == "stale" and "should read 0.40–0.58" in problem
    problem, kind = check_figure("0.5", None, "limit:*:nothing", sources)
    assert kind == "stale" and "limit/results.json holds no figure named '*:nothing'" in problem


def test_a_commit_this_clone_lacks_is_unverified_not_stale(tmp_path):
    problem, kind = check_figure(
        "0.70", None, "overhead@0000000:perf_analyzer:1:ratio", Sources(RESULTS, tmp_path)
    )
    assert kind == "unverified" and "at commit 0000000" in problem
