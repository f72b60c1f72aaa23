"""The summary tables: ratios computed from saved results, provenance, the README block rewritten in place."""

from bench.results import Point, Report, Run, write_json
from bench.summary import END, START, summary_lines, write_summary


def _run(label: str, tool: str, rates: dict[int, float]) -> Run:
    points = [Point(c, None, r, r, 1000.0, 900.0, 1100.0, 1200.0, 1500.0) for c, r in rates.items()]
    return Run(label, tool, "identity_py", "localhost:1", points=points)


def _overhead() -> Report:
    runs = [
        _run("tritonserver (perf_analyzer)", "perf_analyzer", {1: 4000.0, 32: 8000.0}),
        _run("this server (perf_analyzer)", "perf_analyzer", {1: 3000.0, 32: 4000.0}),
        _run("tritonserver (bench)", "bench", {1: 5000.0}),
        _run("this server (bench)", "bench", {1: 2500.0}),
    ]
    env = {
        "git_commit": "0123456789abcdef",
        "git_dirty": False,
        "time_utc": "T",
        "cpu_count": 2,
        "command": "python -m bench scenario overhead",
        "packages": {"ray": "2.60.0"},
    }
    return Report("overhead", env, runs)


def test_overhead_rows_hold_each_tools_ratio_per_concurrency(tmp_path):
    write_json(_overhead(), tmp_path / "overhead" / "results.json")
    lines = summary_lines(tmp_path)
    assert any("`python -m bench scenario overhead` at commit `0123456789`" in line for line in lines)
    row1 = next(line for line in lines if line.startswith("| 1 |"))
    row32 = next(line for line in lines if line.startswith("| 32 |"))
    assert "| 4,000 | 3,000 | 0.75 |" in row1 and "| 5,000 | 2,500 | 0.50 |" in row1
    assert "| 8,000 | 4,000 | 0.50 |" in row32 and row32.endswith("| – | – | – |")


def test_limit_fraction_and_missing_scenarios_are_skipped(tmp_path):
    one = {
        "direct": {"infer_per_s": 2000.0},
        "served_infer_per_s": {"bench": 1500.0, "perf_analyzer": 1000.0},
        "batch_sizes_formed": {"8": 10},
    }
    two = {
        "direct": {"infer_per_s": 4000.0},
        "served_infer_per_s": {"bench": 1000.0},
        "batch_sizes_formed": {},
    }
    notes = {"configurations": {"1 instance": one, "2 instances": two}}
    write_json(Report("limit", {"git_commit": "abc"}, [], notes), tmp_path / "limit" / "results.json")
    text = "\n".join(summary_lines(tmp_path))
    assert "| 1 instance | bench | 1,500 | 2,000 | 0.75 |" in text
    assert "| 1 instance | perf_analyzer | 1,000 | 2,000 | 0.50 |" in text
    assert "| 2 instances | bench | 1,000 | 4,000 | 0.25 |" in text
    assert "1 instance: 8×10; 2 instances: none reported" in text
    assert "Serving overhead" not in text


def test_readme_block_is_replaced_and_the_rest_kept(tmp_path):
    results = tmp_path / "bench" / "results"
    write_json(_overhead(), results / "overhead" / "results.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{START}\nold table\n{END}\nafter\n")
    out = write_summary(results, readme)
    text = readme.read_text()
    assert out.read_text().startswith("# Benchmark results")
    assert "old table" not in text and text.startswith("# Title\n\nbefore\n") and text.endswith("after\n")
    assert "](bench/results/overhead/throughput.png)" in text
    write_summary(results, readme)
    assert readme.read_text() == text  # idempotent


def test_agreement_rows_compare_the_tools_on_each_server(tmp_path):
    report = _overhead()
    report.name = "agreement"
    report.environment |= {"server_cpus": [0], "client_cpus": [1]}
    write_json(report, tmp_path / "agreement" / "results.json")
    text = "\n".join(summary_lines(tmp_path))
    assert "| tritonserver | 1 | 4,000 | 5,000 | 1.25 |" in text
    assert "| this server | 32 | 4,000 | – | – |" in text and "clients on CPUs [1]" in text


def test_cpus_split_into_one_for_the_server_and_the_rest_for_clients():
    from bench.scenarios.agreement import split_cpus

    assert split_cpus({3, 1, 2}) == ({1}, {2, 3})
    assert split_cpus({0}) is None


def test_limit_cpu_table_lists_each_role_beside_the_framework_and_the_budget(tmp_path):
    cpu = {
        "cpu_ms_per_request": {
            "model replicas": 0.9,
            "HAProxy": 0.08,
            "bench client": 0.05,
            "everything else": 0.02,
            "total": 1.05,
        },
        "onnxruntime_cpu_ms_per_request": {"intra_op_threads": 1, "ms": 0.66},
        "budget_ms_per_request": {"fraction": 0.8, "ms": 1.0},
    }
    direct = {
        "infer_per_s": 2000.0,
        "infer_per_s_before_serving": 2100.0,
        "infer_per_s_after_serving": 1900.0,
    }
    entry = {"direct": direct, "served_infer_per_s": {"bench": 1500.0}, "cpu": cpu}
    old = {"direct": {"infer_per_s": 2000.0}, "served_infer_per_s": {"bench": 1500.0}}
    notes = {"configurations": {"2 instances": entry, "saved before": old}}
    write_json(Report("limit", {"git_commit": "abc"}, [], notes), tmp_path / "limit" / "results.json")
    text = "\n".join(summary_lines(tmp_path))
    assert (
        "| 2 instances | 0.900 | 0.080 | 0.050 | 0.020 | 1.050 | 0.660 (1 thread) | 1.000 (at 0.8) |" in text
    )
    assert "| saved before |" not in text.split("CPU milliseconds per request")[1]
    assert "2 instances: 2,100 before serving, 1,900 after" in text
