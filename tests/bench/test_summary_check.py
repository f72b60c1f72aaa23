"""``python -m bench summary --check``: every figure the README, the pages of docs/ and bench/README.md
cite is the one its saved result holds, and none of them states a figure without citing one."""

import json
import shutil
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from bench.summary import (
    BENCH_README,
    DOCS,
    END,
    README,
    RESULTS,
    ROOT,
    START,
    Sources,
    check,
    check_figure,
    figures,
    write_summary,
)

MEASUREMENTS = "docs/measurements.md"


def test_the_repository_figures_and_tables_match_the_saved_results():
    stale, _ = check()
    assert stale == []


def test_the_command_passes_on_the_repository_and_writes_nothing():
    pages = [README, RESULTS / "SUMMARY.md", *sorted(DOCS.glob("*.md"))]
    before = [page.read_text() for page in pages]
    assert bench_main(["summary", "--check"]) == 0
    assert [page.read_text() for page in pages] == before


def test_the_tables_live_in_docs_measurements_and_every_docs_page_is_read():
    text = (ROOT / MEASUREMENTS).read_text()
    assert START in text and END in text
    assert "](../bench/results/overhead/throughput.png)" in text  # image paths relative to docs/
    assert START not in README.read_text()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The README, docs/, bench/README.md and the saved results (without plots) in a temporary folder."""
    shutil.copy(README, tmp_path / "README.md")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copytree(RESULTS, tmp_path / "bench" / "results", ignore=shutil.ignore_patterns("*.png", "*.csv"))
    shutil.copy(BENCH_README, tmp_path / "bench" / "README.md")
    return tmp_path


def _check(copy: Path) -> list[str]:
    stale, _ = check(
        copy / "bench" / "results", copy / "README.md", copy / "bench" / "README.md", ROOT, copy / "docs"
    )
    return stale


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_copy_passes_as_it_is(copy):
    assert _check(copy) == []


# Figures of results as saved at a commit: a new run of a scenario never changes them, so the tests
# that edit a page's figures do not follow each run's numbers.
LIMIT_SAVED = "limit@5405c95:*:*:fraction"  # 0.40–0.58
OVERHEAD_SAVED = "overhead@3f76d13:perf_analyzer:1:ratio"  # 0.57
AGREEMENT_SAVED = "agreement@4143317:this server:*:ratio"  # 1.05–1.10


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_a_stale_figure_is_named_with_the_file_it_should_match(copy):
    _append(copy / "README.md", f"Served at 0.40–0.59<!-- fig {LIMIT_SAVED} --> of it.")
    _append(copy / MEASUREMENTS, f"It read 0.58<!-- fig {OVERHEAD_SAVED} --> there.")
    _append(copy / "bench" / "README.md", f"The tools read 1.05–1.09<!-- fig {AGREEMENT_SAVED} -->.")
    stale = _check(copy)
    assert len(stale) == 3
    assert stale[0].startswith("README.md:") and "0.40–0.59 should read 0.40–0.58" in stale[0]
    assert stale[1].startswith(f"{MEASUREMENTS}:")
    assert (
        "0.58 should read 0.57 (bench/results/overhead/results.json at commit 3f76d13: perf_analyzer:1:ratio)"
        in stale[1]
    )
    assert stale[2].startswith("bench/README.md:") and "1.05–1.09 should read 1.05–1.10" in stale[2]


@pytest.mark.parametrize(
    ("page", "claim", "caught"),
    [
        ("README.md", "Half a claim, 0.99 of it.", "0.99"),
        (MEASUREMENTS, "It once read 1,868 requests.", "1,868"),
        ("docs/grpc.md", "It answers 202 infer/s that way.", "202"),
        ("docs/batching.md", "Twice as fast, 2× even.", "2×"),
        ("docs/sequence.md", "A 15% spread.", "15%"),
    ],
)
def test_a_figure_without_a_citation_is_caught_on_every_page(copy, page, claim, caught):
    path = copy / page
    path.write_text(path.read_text() + f"\n{claim}\n")
    stale = _check(copy)
    assert len(stale) == 1 and stale[0].startswith(f"{page}:") and f"{caught} cites no result" in stale[0]


def test_versions_addresses_and_code_are_not_figures(copy):
    path = copy / "docs" / "operations.md"
    path.write_text(
        path.read_text()
        + "\nHAProxy speaks HTTP/1.1 to Ray 2.60 and tritonserver 2.51 on 10.213.0.10; `0.5` CPU.\n"
    )
    assert _check(copy) == []


def test_a_citation_moved_off_its_figure_is_caught(copy):
    _append(copy / "README.md", f"Served at half to two thirds<!-- fig {LIMIT_SAVED} --> of it.")
    stale = _check(copy)
    assert len(stale) == 1 and "follows no figure" in stale[0]


def test_a_figure_that_changed_in_the_results_is_caught(copy):
    path = copy / "bench" / "results" / "http_floor" / "results.json"
    saved = figures(json.loads(path.read_text()), "http_floor")["server_cpu_ms"]
    shown, changed = f"{saved:.3f}", f"{saved + 0.01:.3f}"
    text = path.read_text()
    key = '"server_cpu_ms_per_request": '
    start = text.index(key) + len(key)
    end = start + len(text[start:].split(",")[0].split("\n")[0].split("}")[0])
    path.write_text(text[:start] + changed + text[end:])
    stale = _check(copy)
    assert len(stale) == 1
    assert f"{shown} should read {changed} (bench/results/http_floor/results.json: server_cpu_ms)" in stale[0]


def _first_row(text: str) -> str:
    """The concurrency-1 row of the first table the summary writes (the overhead scenario's), as saved."""
    return next(line for line in text.splitlines() if line.startswith("| 1 | "))


def _altered(row: str) -> str:
    """``row`` with its first figure changed."""
    cells = row.split(" | ")
    cells[1] = cells[1] + "0"
    return " | ".join(cells)


def test_tables_that_differ_from_the_saved_results_are_caught(copy):
    row = _first_row((copy / MEASUREMENTS).read_text())
    _edit(copy / MEASUREMENTS, row, _altered(row))
    summary = copy / "bench" / "results" / "SUMMARY.md"
    row = _first_row(summary.read_text())
    _edit(summary, row, _altered(row))
    stale = _check(copy)
    assert any(f"{MEASUREMENTS}: the tables differ" in line for line in stale)
    assert any("SUMMARY.md: differs" in line for line in stale)


def test_summary_refreshes_the_block_of_a_docs_page(copy):
    page = copy / MEASUREMENTS
    row = _first_row(page.read_text())
    _edit(page, row, _altered(row))
    write_summary(copy / "bench" / "results", copy / "README.md", copy / "docs")
    assert row in page.read_text() and _altered(row) not in page.read_text()
    assert _check(copy) == []


def test_ranges_globs_and_max_against_the_saved_limit_and_agreement():
    sources = Sources()
    assert check_figure("0.40", "0.58", LIMIT_SAVED, sources) is None
    assert check_figure("1.06", "1.07", "agreement@4143317:tritonserver:{4,16}:ratio", sources) is None
    assert check_figure("0.1", None, "max agreement@4143317:*:*:count_gap_pct", sources) is None
    problem, kind = check_figure("0.50", None, LIMIT_SAVED, sources)  # a range, not one figure
    assert kind == "stale" and "should read 0.40–0.58" in problem
    problem, kind = check_figure("0.5", None, "limit:*:nothing", sources)
    assert kind == "stale" and "limit/results.json holds no figure named '*:nothing'" in problem


def test_a_commit_this_clone_lacks_is_unverified_not_stale(tmp_path):
    problem, kind = check_figure(
        "0.70", None, "overhead@0000000:perf_analyzer:1:ratio", Sources(RESULTS, tmp_path)
    )
    assert kind == "unverified" and "at commit 0000000" in problem


def test_other_saved_files_are_cited_by_their_path_and_numbers_by_their_keys():
    sources = Sources()
    assert (
        check_figure("2.5", None, "recovery/after@c881c4b:results:add_one:first_answer_after_kill_s", sources)
        is None
    )
    assert check_figure("32,200", None, "cluster/node_loss@196c314:bystander:sent", sources) is None
    assert check_figure("0.66", "0.76", "sequence@03624d6:this_server_x2_over_x1:*", sources) is None
    problem, kind = check_figure("1", None, "recovery/nothing:x", sources)
    assert kind == "stale" and "bench/results/recovery/nothing.json" in problem


def test_figures_of_a_plain_json_file_are_its_numbers_by_path():
    data = {
        "environment": {"cpu_count": 2},
        "load": {"sent": 10, "ok": True},
        "points": [{"path": "a", "v": 1.5}],
    }
    assert figures(data, "anything") == {"load:sent": 10.0, "points:a:v": 1.5}
