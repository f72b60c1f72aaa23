"""The conformance runner's pure parts: suite table, model building, flag translation, junit, report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools.triton_qa import (
    batcher,
    decoupled,
    dyna_sequence,
    implicit_state,
    infer,
    infer_variable,
    infer_zero,
    iterative_sequence,
    log_settings,
    model_queue,
    model_update,
    response_cache,
    shared_memory,
    simple_ensemble,
    string_io,
    unittest_junit,
)
from tools.triton_qa.junit import TestOutcome, parse_junit_text
from tools.triton_qa.models import OWN_MODELS, apply_edit, build_repository
from tools.triton_qa.report import RunRecord, load_reference, write_results
from tools.triton_qa.runner import (
    REFERENCE,
    THIS,
    RunResult,
    Workspace,
    pytest_command,
    repository_path,
    run_env,
    translate_args,
)
from tools.triton_qa.suites import SUITES, Edit, Model, select

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="http_test.HttpTest" name="test_byte" time="0.5"/>
<testcase classname="http_test.HttpTest" name="test_raw" time="0.1">
  <failure message="AssertionError: 400 != 200&#10;second line">trace</failure></testcase>
<testcase classname="http_test.HttpTest" name="test_setup" time="0"><error message="">
boom happened
more</error></testcase>
<testcase classname="http_test.HttpTest" name="test_cuda" time="0"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>
"""


def test_suite_table_names_the_first_suites_and_their_test_files() -> None:
    assert {"L0_http", "L0_grpc", "L0_backend_python", "L0_batcher"} <= set(SUITES)
    assert {"L0_infer_zero", "L0_infer_variable", "L0_string_io"} <= set(SUITES)
    assert batcher.L0_BATCHER is SUITES["L0_batcher"]
    assert log_settings.L0_LOGGING is SUITES["L0_logging"]
    assert [r.test_file for r in SUITES["L0_logging"].runs] == ["logging_endpoint_test.py"]
    for suite in SUITES.values():
        assert suite.runs
        labels = [r.label for r in suite.runs]
        assert len(labels) == len(set(labels)), suite.name
        for run in suite.runs:
            assert run.test_file.endswith(".py")
            assert not any(a.startswith("--http-port") for a in run.server_args)
            # the runner names the run's repository; a second one is a folder of the work copy
            repositories = [a for a in run.server_args if a.startswith("--model-repository")]
            assert all(a.startswith("--model-repository={qa}/") for a in repositories)
            assert not run.server_per_test or run.tests


def test_select_keeps_order_and_rejects_unknown_names() -> None:
    assert [s.name for s in select(["L0_grpc", "L0_http"])] == ["L0_grpc", "L0_http"]
    assert len(select(["all"])) == len(SUITES)
    with pytest.raises(KeyError, match="L0_nope"):
        select(["L0_http", "L0_nope"])


def test_batcher_delay_runs_carry_the_scheduler_delay() -> None:
    delays = {r.label: r.env.get("TRITONSERVER_DELAY_SCHEDULER") for r in batcher.L0_BATCHER.runs}
    assert delays["FIXED delay 6"] == "6"
    assert delays["FIXED no delay"] is None
    assert all(r.env["BACKENDS"] == "onnx python" for r in batcher.L0_BATCHER.runs)


def test_edits_follow_sed_scopes() -> None:
    text = "dims: [ -1, -1 ]\nx: -1\n"
    assert apply_edit(text, Edit("-1", "1")) == "dims: [ 1, -1 ]\nx: 1\n"
    assert apply_edit(text, Edit("-1", "1", scope="all")) == "dims: [ 1, 1 ]\nx: 1\n"
    assert apply_edit(text, Edit("-1", "1", scope="file")) == "dims: [ 1, -1 ]\nx: -1\n"
    assert apply_edit("max_batch_size: 0\n", Edit(r"^max_batch_size:.*", "max_batch_size: 8")) == (
        "max_batch_size: 8\n"
    )


def test_build_repository_copies_python_models_and_lists_what_it_cannot_build(tmp_path: Path) -> None:
    src = tmp_path / "checkout" / "qa" / "python_models" / "echo"
    src.mkdir(parents=True)
    (src / "config.pbtxt").write_text('name: "echo"\nmax_batch_size: 0\n')
    (src / "model.py").write_text("# model\n")
    (src / "helper.py").write_text("# helper\n")
    models = (
        Model(
            "echo_batched",
            "python",
            "qa/python_models/echo",
            edits=(Edit("max_batch_size: 0", "max_batch_size: 4"),),
            append="dynamic_batching { }\n",
        ),
        Model("simple", "own", "simple"),
        Model("gone", "missing", "needs a GPU"),
        Model("absent", "python", "qa/python_models/absent"),
    )
    built = build_repository(models, tmp_path / "checkout", tmp_path / "cache", tmp_path / "repo")
    echo = built.path / "echo_batched"
    assert (echo / "1" / "model.py").exists() and (echo / "1" / "helper.py").exists()
    config = (echo / "config.pbtxt").read_text()
    assert "max_batch_size: 4" in config and config.endswith("dynamic_batching { }\n")
    assert (built.path / "simple" / "1" / "model.py").exists()
    assert [m for m, _ in built.skipped] == ["gone", "absent"]
    assert not (built.path / "gone").exists() and not (built.path / "absent").exists()


def test_translate_args_keeps_known_flags_and_lists_the_others() -> None:
    options = {"--model-control-mode": 1, "--http-restricted-api": 1, "--disable-auto-complete-config": 0}
    kept, dropped = translate_args(
        [
            "--model-control-mode=explicit",
            "--http-restricted-api=inference:k=v",
            "--strict-readiness=false",
            "--disable-auto-complete-config",
            "--log-verbose=1",
        ],
        options,
    )
    assert kept == [
        "--model-control-mode",
        "explicit",
        "--http-restricted-api",
        "inference:k=v",
        "--strict-readiness",
        "false",
        "--disable-auto-complete-config",
    ]
    assert dropped == ["--log-verbose=1"]


def test_pytest_command_selects_unittest_classes_and_methods(tmp_path: Path) -> None:
    cmd = pytest_command("batcher_test.py", ["BatcherTest.test_a", "Other"], tmp_path / "j.xml", 60)
    assert cmd[-2:] == ["batcher_test.py::BatcherTest::test_a", "batcher_test.py::Other"]
    assert f"--junitxml={tmp_path / 'j.xml'}" in cmd
    left_out = pytest_command("d.py", [], tmp_path / "j.xml", 60, not_here=["DecoupledTest.test_gpu"])
    assert "--deselect=d.py::DecoupledTest::test_gpu" in left_out and left_out[-1] == "d.py"


def test_junit_outcomes_carry_status_and_first_message_line() -> None:
    outcomes = parse_junit_text(JUNIT)
    assert [(o.test_id, o.status) for o in outcomes] == [
        ("http_test.HttpTest.test_byte", "passed"),
        ("http_test.HttpTest.test_raw", "failed"),
        ("http_test.HttpTest.test_setup", "error"),
        ("http_test.HttpTest.test_cuda", "skipped"),
    ]
    assert outcomes[1].message == "AssertionError: 400 != 200"
    assert outcomes[2].message == "boom happened"


def test_write_results_makes_the_table_json_and_failure_list(tmp_path: Path) -> None:
    ok = TestOutcome("t.T.test_a", "passed")
    bad = TestOutcome("t.T.test_b", "failed", "AssertionError: 1 != 2")
    record = RunRecord(
        "L0_http",
        "http_test",
        "http_test.py",
        {
            REFERENCE: RunResult(REFERENCE, [ok, TestOutcome("t.T.test_b", "passed")]),
            THIS: RunResult(THIS, [ok, bad], dropped_args=["--log-verbose=1"]),
        },
        skipped_models=[("square_int32", "not in the checkout")],
    )
    meta = {"command": "python -m tools.triton_qa --suites L0_http", "commit": "abc", "seconds": 12.0}
    cannot = [{"suite": "L0_http", "what": "C++ clients", "why": "not built"}]
    out = write_results([record], meta, cannot, tmp_path)
    doc = json.loads((out / "results.json").read_text())
    run = doc["runs"][0]
    assert run["tests"] == 2
    assert run["servers"][REFERENCE]["passed"] == 2 and run["servers"][THIS]["passed"] == 1
    assert run["servers"][THIS]["outcomes"]["t.T.test_b"] == {
        "status": "failed",
        "message": "AssertionError: 1 != 2",
    }
    readme = (out / "README.md").read_text()
    assert "| L0_http | http_test.py | 2 | 2 | 1 |" in readme
    assert "`t.T.test_b` failed (tritonserver: passed): AssertionError: 1 != 2" in readme
    assert "--log-verbose=1" in readme and "square_int32" in readme and "C++ clients" in readme


def test_an_earlier_sessions_tritonserver_results_fill_the_reference_column(tmp_path: Path) -> None:
    ok, bad = TestOutcome("t.T.test_a", "passed"), TestOutcome("t.T.test_b", "failed", "AssertionError: x")
    earlier = RunRecord(
        "L0_http",
        "http_test",
        "http_test.py",
        {
            REFERENCE: RunResult(REFERENCE, [ok, bad], not_ready=["m: UNAVAILABLE"]),
            THIS: RunResult(THIS, [ok]),
        },
    )
    old = write_results([earlier], {"commit": "0123456789abc", "started": "2026-11-01"}, [], tmp_path / "old")
    other = RunRecord("L0_http", "http_test", "http_test.py", {REFERENCE: RunResult(REFERENCE, [ok, ok])})
    older = write_results([other], {"commit": "fff"}, [], tmp_path / "older")
    found = load_reference([old / "results.json", older / "results.json"])
    ref, source = found[("L0_http", "http_test")]  # the first file that ran the run wins
    assert [(o.test_id, o.status, o.message) for o in ref.outcomes] == [
        ("t.T.test_a", "passed", ""),
        ("t.T.test_b", "failed", "AssertionError: x"),
    ]
    assert ref.not_ready == ["m: UNAVAILABLE"] and source["commit"] == "0123456789abc"
    now = RunRecord("L0_http", "http_test", "http_test.py", {REFERENCE: ref, THIS: RunResult(THIS, [ok, ok])})
    meta = {"commit": "new", "reference_from": [source]}
    readme = (write_results([now], meta, [], tmp_path / "new") / "README.md").read_text()
    assert "| L0_http | http_test.py | 2 | 1 | 2 |" in readme
    assert f"read from `{old / 'results.json'}` (run at commit `012345678`" in readme


def test_unittest_junit_records_each_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the runner sets both, as `python file.py` would
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "sample_test.py").write_text(
        "import unittest\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        pass\n"
        "    def test_bad(self):\n        self.assertEqual(1, 2)\n"
        "    def test_sub(self):\n"
        "        for i in range(2):\n"
        "            with self.subTest(i=i):\n                self.assertEqual(i, 0)\n"
    )
    junit = tmp_path / "out.xml"
    code = unittest_junit.main([f"--junit={junit}", str(tmp_path / "sample_test.py")])
    assert code == 1
    status = {o.test_id: o.status for o in parse_junit_text(junit.read_text())}
    assert status == {
        "sample_test.T.test_ok": "passed",
        "sample_test.T.test_bad": "failed",
        "sample_test.T.test_sub": "failed",
    }


def test_unittest_junit_gives_tests_written_for_python_310_their_teardown_outcome(tmp_path: Path) -> None:
    """A ``tearDown`` that asks, the Python 3.10 way, whether its test failed gets the answer."""
    import subprocess

    (tmp_path / "outcome_test.py").write_text(
        "import unittest\n\n"
        "class T(unittest.TestCase):\n"
        "    def tearDown(self):\n"
        "        r = self.defaultTestResult()\n"
        "        self._feedErrorsToResult(r, self._outcome.errors)\n"
        "        passed = all(self != t for t, _ in r.errors + r.failures)\n"
        "        print('teardown', self._testMethodName, passed)\n"
        "    def test_a(self):\n        pass\n"
        "    def test_b(self):\n        self.assertEqual(1, 2)\n"
    )
    junit = tmp_path / "out.xml"
    cmd = [sys.executable, "-m", "tools.triton_qa.unittest_junit", f"--junit={junit}", "outcome_test.py"]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "teardown test_a True" in out.stdout and "teardown test_b False" in out.stdout, out.stderr
    status = {o.test_id: o.status for o in parse_junit_text(junit.read_text())}
    assert status == {"outcome_test.T.test_a": "passed", "outcome_test.T.test_b": "failed"}


def test_unittest_junit_reports_the_tests_finished_before_the_process_ends(tmp_path: Path) -> None:
    """A test process stopped for its time limit leaves the report of the tests it finished."""
    import subprocess

    (tmp_path / "ends_test.py").write_text(
        "import os, unittest\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_a(self):\n        pass\n"
        "    def test_b(self):\n        os._exit(3)\n"
    )
    junit = tmp_path / "out.xml"
    cmd = [sys.executable, "-m", "tools.triton_qa.unittest_junit", f"--junit={junit}", "ends_test.py"]
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    assert subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True).returncode == 3
    assert [(o.test_id, o.status) for o in parse_junit_text(junit.read_text())] == [
        ("ends_test.T.test_a", "passed")
    ]


def test_the_tests_find_the_stand_in_for_tritons_compiled_shm_monitor(tmp_path: Path) -> None:
    """Triton's ``shm_util.ShmLeakDetector`` imports ``triton_shm_monitor`` (built by its qa image): the
    test environment names the stand-in, whose regions never change size (no leak reported)."""
    import subprocess
    from types import SimpleNamespace

    from tools.triton_qa.runner import HARNESS, test_env

    ws, run = (
        SimpleNamespace(qa=tmp_path / "qa"),
        SimpleNamespace(env={"BACKENDS": "python"}, only_backends=()),
    )
    env = test_env(ws, run, tmp_path / "server.log")  # type: ignore[arg-type]
    assert str(HARNESS) in env["PYTHONPATH"].split(":") and env["BACKENDS"] == "python"
    probe = (
        "import triton_shm_monitor as m\n"
        "r = m.SharedMemoryManager('triton_python_backend_shm_region_1')\n"
        "assert r.free_memory() == r.free_memory()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_server_log_is_where_the_tests_open_it_under_test_shs_name(tmp_path: Path) -> None:
    from tools.triton_qa.runner import link_server_log

    log = tmp_path / "runs" / "server-this.log"
    log.parent.mkdir()
    log.write_text("[execute_cancel] Request cancelled at 2.0 s\n")
    suite_dir = tmp_path / "L0_backend_python"
    suite_dir.mkdir()
    assert link_server_log(suite_dir, "", log) is None
    link = link_server_log(suite_dir, "decoupled_server.log", log)
    assert link is not None and "Request cancelled" in (suite_dir / "decoupled_server.log").read_text()
    assert link_server_log(suite_dir, "decoupled_server.log", log) == link  # a leftover is replaced
    from tools.triton_qa.suites import SUITES

    names = {r.label: r.server_log_name for r in SUITES["L0_backend_python"].runs}
    assert names["decoupled"] == "decoupled_server.log" and names["lifecycle"] == "lifecycle_server.log"


def test_sequence_delay_runs_carry_test_sh_delays() -> None:
    from tools.triton_qa import sequence

    assert sequence.delays("test_backlog_fill_no_end") == ("3", "10")
    assert sequence.delays("test_backlog_fill") == ("2", "10")
    assert sequence.delays("test_backlog_same_correlation_id") == ("2", "12")
    assert sequence.delays("test_backlog_same_correlation_id_no_end") == ("0", "16")
    assert sequence.delays("test_half_batch") == ("0", "8")
    assert sequence.delays("test_backlog_sequence_timeout") == ("0", "4")
    assert sequence.delays("test_full_batch") == ("0", "12")
    runs = {r.label: r for r in sequence.L0_SEQUENCE_BATCHER.runs}
    assert len(runs) == len(sequence.L0_SEQUENCE_BATCHER.runs)  # labels are unique (--runs picks by label)
    for trial in sequence.TRIALS:
        mine = [r for label, r in runs.items() if label.startswith(trial.label + ", ")]
        tests = [t.split(".")[1] for r in mine for t in r.tests]
        assert sorted(tests) == sorted(sequence.NO_DELAY_TESTS + sequence.DELAY_TESTS)  # each once a trial
        assert all(r.env["BACKENDS"] == "python" and r.server_per_test for r in mine)
        for r in mine:
            if "no delay" in r.label:
                assert "TRITONSERVER_DELAY_SCHEDULER" not in r.env
            else:
                test = r.tests[0].split(".")[1]
                pair = (r.env["TRITONSERVER_BACKLOG_DELAY_SCHEDULER"], r.env["TRITONSERVER_DELAY_SCHEDULER"])
                assert pair == sequence.delays(test)


def test_sequence_trials_are_test_sh_model_trials() -> None:
    """NO_BATCHING, MODEL_INSTANCES, BATCHER_TYPE and each trial's configuration edits as test.sh makes them."""
    from tools.triton_qa import sequence

    config = (
        'name: "onnx_{infix}sequence_int32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {mbs}\n'
        "instance_group [ {{ kind: KIND_GPU }} ]\n"
    )
    seen = {}
    for trial in sequence.TRIALS:
        env = trial.env
        seen[trial.name] = (env["NO_BATCHING"], env["MODEL_INSTANCES"], env["BATCHER_TYPE"])
        model = trial.models()[0]
        repository, folder = model.source.split("/")
        text = config.format(infix=trial.infix, mbs=0 if trial.infix else 8)
        for edit in model.edits:
            text = apply_edit(text, edit)
        mbs = {"0": 0, "1": 4, "2": 2, "4": 1, "v": 4}[trial.name]
        assert text == (
            f'name: "python_{trial.infix}sequence_int32"\nbackend: "python"\nmax_batch_size: {mbs}\n'
            f"instance_group [ {{ kind: KIND_CPU\ncount: {env['MODEL_INSTANCES']} }} ]\n"
        )
        assert model.name == folder.replace("onnx", "python")
        variable = "qa_variable_sequence_model_repository"
        assert repository == (variable if trial.name == "v" else "qa_sequence_model_repository")
    assert seen == {
        "0": ("1", "4", "FIXED"),
        "1": ("0", "1", "FIXED"),
        "2": ("0", "2", "FIXED"),
        "4": ("0", "4", "FIXED"),
        "v": ("0", "1", "VARIABLE"),
    }
    assert [t.infix for t in sequence.TRIALS] == ["nobatch_", "", "", "", ""]


def _pregenerated(cache: Path, repository: str, model: str, config: str) -> None:
    """``cache/repository/model/config.pbtxt`` as if ``gen_qa_*.py`` had written it (no script runs)."""
    (cache / repository / model).mkdir(parents=True)
    (cache / repository / model / "config.pbtxt").write_text(config)
    (cache / repository / ".complete").write_text("")


def test_infer_zero_asks_onnx_and_runs_the_zero_ensembles_on_python_nops(tmp_path: Path) -> None:
    (run,) = infer_zero.L0_INFER_ZERO.runs
    assert run.test_file == "infer_zero_test.py" and dict(run.env) == {"BACKENDS": "onnx"}
    names = {m.name for m in run.models}
    assert {"onnx_zero_1_bool", "onnx_nobatch_zero_3_object", "fan_zero_nobatch_zero_3_float16"} <= names
    assert not any(n.endswith("_object") for n in names if not n.startswith("onnx_"))  # no string ensembles
    assert len(names) == 14 + 30 + 3
    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    (checkout / "qa" / "python_models" / "identity_fp32").mkdir(parents=True)
    (checkout / "qa" / "python_models" / "identity_fp32" / "model.py").write_text("# identity\n")
    nop = "nop_TYPE_FP16_-1,-1"
    _pregenerated(
        cache,
        "qa_ensemble_identity_model_repository",
        nop,
        f'\nname: "{nop}"\nbackend: "identity"\nmax_batch_size: 1024\n',
    )
    built = build_repository(
        tuple(m for m in run.models if m.name == nop), checkout, cache, tmp_path / "repo"
    )
    assert not built.skipped
    assert (built.path / nop / "config.pbtxt").read_text() == (
        f'\nname: "{nop}"\nbackend: "python"\nmax_batch_size: 1024\n'
    )
    assert (built.path / nop / "1" / "model.py").read_text() == "# identity\n"


def test_infer_makes_test_shs_python_models_from_the_onnx_configurations(tmp_path: Path) -> None:
    python_run, onnx_run = infer.L0_INFER.runs
    assert python_run.env["BACKENDS"] == "python" and onnx_run.env["BACKENDS"] == "onnx python"
    assert python_run.env["TRITON_SERVER_CPU_ONLY"] == "1"
    assert all("this:--model-hosts=1" in r.server_args for r in (python_run, onnx_run))  # one host here
    names = [m.name for m in onnx_run.models]
    assert len(names) == len(set(names)) == 40 + 40 + 120 + 39
    assert {"python_nobatch_object_int32_object", "fan_onnx_int8_int8_int8", "nop_TYPE_STRING_-1,-1"} <= set(
        names
    )
    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    for code in ("add_sub", "sub_add"):
        (checkout / "qa" / "python_models" / code).mkdir(parents=True)
        (checkout / "qa" / "python_models" / code / "model.py").write_text(f"# {code}\n")
    for onnx_name in ("onnx_int32_int8_int8", "onnx_nobatch_int8_int8_int8"):
        _pregenerated(
            cache,
            "qa_model_repository",
            onnx_name,
            f'\nname: "{onnx_name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            "version_policy: { latest { num_versions: 1 }}\n",
        )
        (cache / "qa_model_repository" / onnx_name / "output0_labels.txt").write_text("label\n")
    wanted = {"python_int32_int8_int8", "python_nobatch_int8_int8_int8", "onnx_int32_int8_int8"}
    built = build_repository(
        tuple(m for m in onnx_run.models if m.name in wanted), checkout, cache, tmp_path / "repo"
    )
    assert not built.skipped
    assert (built.path / "python_int32_int8_int8" / "config.pbtxt").read_text() == (
        '\nname: "python_int32_int8_int8"\n\nmax_batch_size: 8\nbackend: "python"\n'
        "instance_group [ { kind: KIND_CPU }]\n"
    )
    assert (built.path / "python_int32_int8_int8" / "1" / "model.py").read_text() == "# add_sub\n"
    assert (built.path / "python_int32_int8_int8" / "output0_labels.txt").read_text() == "label\n"
    # int8 in and out: version 1 of gen_qa_models.py's model subtracts first, as test.sh's swap
    assert (built.path / "python_nobatch_int8_int8_int8" / "1" / "model.py").read_text() == "# sub_add\n"
    assert (
        (built.path / "onnx_int32_int8_int8" / "config.pbtxt")
        .read_text()
        .endswith("instance_group [ { kind: KIND_CPU }]\n")
    )
    nop = next(m for m in onnx_run.models if m.name == "nop_TYPE_INT8_-1")
    assert nop.files[1] == ("own:identity/1/model.py", "1/model.py")


def test_implicit_state_lists_the_state_output_on_the_copy_test_sh_makes(tmp_path: Path) -> None:
    (run,) = implicit_state.L0_IMPLICIT_STATE.runs
    assert run.env["BACKENDS"] == "onnx" and len(run.tests) == 2
    name = implicit_state.MODEL
    _pregenerated(
        tmp_path / "cache",
        "qa_sequence_implicit_model_repository",
        name,
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\ninstance_group [ {{ kind: KIND_GPU }} ]\n',
    )
    built = build_repository(run.models, tmp_path / "checkout", tmp_path / "cache", tmp_path / "repo")
    assert not built.skipped
    plain = (built.path / name / "config.pbtxt").read_text()
    assert "KIND_CPU" in plain and "KIND_GPU" not in plain and "OUTPUT_STATE" not in plain
    copy = (built.path / f"{name}_output" / "config.pbtxt").read_text()
    assert copy.startswith(f'name: "{name}_output"') and 'output [{ name: "OUTPUT_STATE"' in copy


def test_string_io_makes_string_identity_eight_wide_and_stands_in_for_the_graphdef_model(
    tmp_path: Path,
) -> None:
    (run,) = string_io.L0_STRING_IO.runs
    assert run.test_file == "string_client_test.py" and not run.env and not run.server_args
    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    src = checkout / "qa" / "python_models" / "string_identity"
    src.mkdir(parents=True)
    (src / "model.py").write_text("# string identity\n")
    (src / "config.pbtxt").write_text('name: "string_identity"\ninput [ { dims: [ 1 ] } ]\n')
    _pregenerated(
        cache,
        "qa_identity_model_repository",
        "onnx_nobatch_zero_1_object",
        '\nname: "onnx_nobatch_zero_1_object"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n',
    )
    built = build_repository(run.models, checkout, cache, tmp_path / "repo")
    assert not built.skipped
    stand_in = built.path / "graphdef_nobatch_zero_1_object"
    assert (stand_in / "config.pbtxt").read_text() == (
        '\nname: "graphdef_nobatch_zero_1_object"\nbackend: "python"\nmax_batch_size: 0\n'
    )
    assert (stand_in / "1" / "model.py").read_text() == "# string identity\n"
    identity = built.path / "string_identity"
    assert "dims: [ 8 ]" in (identity / "config.pbtxt").read_text()
    assert (identity / "1" / "model.py").exists()


def test_infer_variable_runs_test_shs_cpu_target_on_the_onnx_models(tmp_path: Path) -> None:
    (run,) = infer_variable.L0_INFER_VARIABLE.runs
    assert run.test_file == "infer_variable_test.py" and run.server_args == ("--exit-timeout-secs=120",)
    assert not run.tests and not run.env  # every test; the file reads no BACKENDS
    names = [m.name for m in run.models]
    assert len(names) == 11 and all(n.startswith("onnx_nobatch_") for n in names)
    assert "onnx_nobatch_object_int32_object" in names and "onnx_nobatch_float32_int64_int64" in names
    name = "onnx_nobatch_int32_int32_float32"
    _pregenerated(
        tmp_path / "cache",
        "qa_variable_model_repository",
        name,
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n',
    )
    model = next(m for m in run.models if m.name == name)
    built = build_repository((model,), tmp_path / "checkout", tmp_path / "cache", tmp_path / "repo")
    assert (built.path / name / "config.pbtxt").read_text() == (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        "instance_group [ { kind: KIND_CPU }]\n"
    )


def test_a_run_with_only_backends_gets_test_util_with_the_other_validators_off(tmp_path: Path) -> None:
    """``only_backends``: the test process imports ``test_util`` from ``tools/triton_qa/restrict``,
    which loads the checkout's own module and refuses the validators of every other backend."""
    import subprocess

    from tools.triton_qa import runner

    common = tmp_path / "common"
    common.mkdir()
    (common / "test_util.py").write_text(
        "def validate_for_tf_model(*a):\n    return True\n"
        "def validate_for_onnx_model(*a):\n    return True\n"
        "def shape_to_dims_str(shape):\n    return ','.join(str(i) for i in shape)\n"
    )
    (run,) = infer_variable.L0_INFER_VARIABLE.runs
    assert run.only_backends == ("onnx",)

    class Workspace:
        qa = tmp_path

    env = runner.test_env(Workspace(), run, tmp_path / "server.log")  # type: ignore[arg-type]
    probe = "import test_util as t; print(t.validate_for_tf_model(), t.validate_for_onnx_model(), t.shape_to_dims_str([2, 3]))"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "2,3"]


def test_graphdef_stand_ins_take_the_onnx_configuration_and_an_add_sub_per_version(tmp_path: Path) -> None:
    (model, ensemble) = response_cache.MODELS
    assert model.name == "graphdef_float32_float32_float32"
    _pregenerated(
        tmp_path / "cache",
        "qa_model_repository",
        "onnx_float32_float32_float32",
        'name: "onnx_float32_float32_float32"\nplatform: "onnxruntime_onnx"\n',
    )
    (tmp_path / "cache/qa_model_repository/onnx_float32_float32_float32/output0_labels.txt").write_text("")
    built = build_repository((model,), tmp_path / "checkout", tmp_path / "cache", tmp_path / "repo")
    folder = built.path / model.name
    assert (folder / "config.pbtxt").read_text() == (
        'name: "graphdef_float32_float32_float32"\nbackend: "python"\n'
    )
    assert all((folder / v / "model.py").exists() for v in ("1", "2", "3"))
    assert ensemble.source == "qa_ensemble_model_repository/simple_graphdef_float32_float32_float32"


def test_a_run_that_edits_its_repository_gets_it_in_the_suites_folder(tmp_path: Path) -> None:
    suite = response_cache.L0_RESPONSE_CACHE
    ws = Workspace(tmp_path / "checkout", tmp_path / "work")
    for run in suite.runs:
        assert repository_path(ws, suite, run) == ws.qa / "L0_response_cache" / "models" / "ensemble_models"
    other = simple_ensemble.L0_SIMPLE_ENSEMBLE
    assert (
        repository_path(ws, other, other.runs[0])
        == ws.root / "runs" / "L0_simple_ensemble" / "ensemble" / "models"
    )


def test_decoupled_stand_ins_keep_test_shs_repository_and_non_decoupled_edit(tmp_path: Path) -> None:
    runs = {r.label: r for r in decoupled.L0_DECOUPLED.runs}
    assert dict(runs["delayed gRPC responses"].env) == {"TRITONSERVER_DELAY_GRPC_RESPONSE": "2000"}
    checkout = tmp_path / "checkout"
    src = checkout / "qa" / "L0_decoupled" / "models"
    for name in ("identity_int32", "fan_repeat"):
        (src / name).mkdir(parents=True)
        (src / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "identity"\n')
    models = [
        m for m in runs["decoupled"].models if m.name in ("repeat_int32", "square_int32", "identity_int32")
    ]
    built = build_repository(tuple(models), checkout, tmp_path / "cache", tmp_path / "repo")
    assert not built.skipped
    assert "decoupled: True" in (built.path / "repeat_int32" / "config.pbtxt").read_text()
    assert 'backend: "python"' in (built.path / "identity_int32" / "config.pbtxt").read_text()
    assert (built.path / "square_int32" / "1" / "model.py").exists()
    (single,) = runs["non-decoupled"].models
    built = build_repository((single,), checkout, tmp_path / "cache", tmp_path / "repo2")
    assert "decoupled: False" in (built.path / "repeat_int32" / "config.pbtxt").read_text()


def test_shared_memory_runs_each_test_on_a_server_of_its_own_per_client() -> None:
    runs = {run.label: run for run in shared_memory.L0_SHARED_MEMORY.runs}
    for client in ("http", "grpc"):
        run = runs[f"shared_memory_test ({client})"]
        assert run.server_per_test and run.env["CLIENT_TYPE"] == client
        assert "SharedMemoryTest.test_register_out_of_bound" in run.tests
        (delayed,) = runs[f"unregister during inference ({client})"].models
        assert delayed.name == "simple" and delayed.source.endswith("execute_delayed_model")
    assert SUITES["L0_shared_memory"] is shared_memory.L0_SHARED_MEMORY


def test_the_psutil_stand_in_reads_this_processs_resident_size() -> None:
    import importlib.util

    from tools.triton_qa.runner import HARNESS

    spec = importlib.util.spec_from_file_location("psutil_stand_in", HARNESS / "psutil.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first = module.Process().memory_info().rss
    ballast = bytearray(64 * 1024 * 1024)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page
    assert module.Process().memory_info().rss > first + 32 * 1024 * 1024
    del ballast


def test_model_update_runs_each_rate_limit_mode_with_the_log_folder_in_the_suites_folder(
    tmp_path: Path,
) -> None:
    """test.sh runs the instance tests once per rate limiter mode on ``models`` of its own folder, which
    is also ``MODEL_LOG_DIR`` for the tests and the model's processes; the model's ``util`` stays next to
    its configuration (the test imports it from there)."""
    from tools.triton_qa.runner import test_env

    suite = model_update.L0_MODEL_UPDATE
    ws = Workspace(tmp_path / "checkout", tmp_path / "work")
    assert [r.env["RATE_LIMIT_MODE"] for r in suite.runs] == [
        "off",
        "execution_count",
        "execution_count_with_explicit_resource",
    ]
    assert suite.runs[2].server_args[1:3] == ("--rate-limit=execution_count", "--rate-limit-resource=R1:10")
    folder = ws.qa / "L0_model_update"
    for run in suite.runs:
        assert "--model-control-mode=explicit" in run.server_args
        assert repository_path(ws, suite, run) == folder / "models"
        assert run_env(run, ws.qa)["MODEL_LOG_DIR"] == str(folder)
        assert test_env(ws, run, tmp_path / "s.log")["MODEL_LOG_DIR"] == str(folder)
        assert not any("gpu" in t for t in run.tests)
    src = tmp_path / "checkout" / "qa" / "python_models" / "model_init_del"
    src.mkdir(parents=True)
    for name in ("config.pbtxt", "model.py", "util.py"):
        (src / name).write_text(f"# {name}\n")
    built = build_repository(suite.runs[0].models, ws.checkout, ws.cache, folder / "models")
    model = built.path / "model_init_del"
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*.*")) == [
        "1/model.py",
        "config.pbtxt",
        "util.py",
    ]


def test_dyna_sequence_runs_follow_test_shs_loops_per_backend() -> None:
    """Each backend runs test.sh's loops, a server per test, with NO_BATCHING as each loop sets it and no
    scheduler delay (the tests assert it is unset)."""
    runs = {r.label: r for r in dyna_sequence.L0_DYNA_SEQUENCE_BATCHER.runs}
    assert len(runs) == len(dyna_sequence.L0_DYNA_SEQUENCE_BATCHER.runs)
    for label, run in runs.items():
        assert run.server_per_test and run.test_file == "dyna_sequence_batcher_test.py"
        assert "TRITONSERVER_DELAY_SCHEDULER" not in run.env
        assert run.env["NO_BATCHING"] == ("1" if label.endswith("no batching") else "0")
        assert run.env["IMPLICIT_STATE"] == ("1" if "implicit" in label else "0")
        assert run.env["BACKENDS"] == ("custom custom_string" if label.startswith("custom") else "onnx")
    methods = {label: [t.split(".")[1] for t in run.tests] for label, run in runs.items()}
    assert methods["custom, no batching"] == ["test_simple_sequence", "test_length1_sequence"]
    assert methods["custom, queue delay"] == list(dyna_sequence.QUEUE_DELAY_TESTS)
    assert methods["custom, ragged"] == ["test_multi_sequence_different_shape_allow_ragged"]
    # the different-shape test has custom trials only: on onnx it would pass without a request
    assert methods["onnx, queue delay"] == list(dyna_sequence.QUEUE_DELAY_TESTS[1:])


def test_dyna_sequence_custom_models_are_test_shs_copies_on_the_python_stand_in(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    src = checkout / "qa" / "custom_models" / "custom_dyna_sequence_int32"
    src.mkdir(parents=True)
    (src / "config.pbtxt").write_text(
        'name: "custom_dyna_sequence_int32"\nbackend: "dyna_sequence"\nmax_batch_size: 8\n'
        'default_model_filename: "libtriton_dyna_sequence.so"\n'
        "sequence_batching {\n  oldest {\n    max_candidate_sequences: 6\n"
        "    max_queue_delay_microseconds: 0\n  }\n"
        '  control_input [ { name: "CORRID"\n control [ { kind: CONTROL_SEQUENCE_CORRID\n'
        "          data_type: TYPE_UINT64\n } ] } ]\n}\n"
        'input [ {\n    name: "INPUT"\n    data_type: TYPE_INT32\n  } ]\n'
        "instance_group [ {\n    kind: KIND_CPU\n  } ]\n"
    )
    ragged = {r.label: r for r in dyna_sequence.L0_DYNA_SEQUENCE_BATCHER.runs}["custom, ragged"]
    models = (*dyna_sequence.custom_models(*dyna_sequence.QUEUE_DELAY), *ragged.models)
    repo = tmp_path / "repo"
    built = build_repository(models[:2], checkout, tmp_path / "cache", repo)
    assert not built.skipped
    plain = (repo / "custom_dyna_sequence_int32" / "config.pbtxt").read_text()
    string = (repo / "custom_string_dyna_sequence_int32" / "config.pbtxt").read_text()
    for text in (plain, string):
        assert 'backend: "python"' in text and "default_model_filename" not in text
        assert "kind: KIND_CPU\ncount: 1\n" in text
        assert "max_candidate_sequences:4\n" in text and "max_queue_delay_microseconds:5000000\n" in text
    assert "TYPE_UINT64" in plain and 'name: "custom_string_dyna_sequence_int32"' in string
    assert "data_type: TYPE_STRING" in string and "TYPE_UINT64" not in string
    assert (repo / "custom_string_dyna_sequence_int32" / "1" / "model.py").exists()
    build_repository(models[2:], checkout, tmp_path / "cache", repo)
    text = (repo / "custom_dyna_sequence_int32" / "config.pbtxt").read_text()
    assert 'name: "INPUT"\nallow_ragged_batch: true\n' in text


class _Tensor:
    def __init__(self, name: str, array: object) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> object:
        return self.array


class _Request:
    def __init__(self, **inputs: object) -> None:
        self.inputs = inputs


def _dyna_sequence_stand_in(monkeypatch: pytest.MonkeyPatch) -> object:
    """The stand-in's ``TritonPythonModel`` over a fake ``triton_python_backend_utils``."""
    import types

    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = _Tensor  # type: ignore[attr-defined]
    fake.get_input_tensor_by_name = lambda r, n: _Tensor(n, r.inputs[n])  # type: ignore[attr-defined]
    fake.InferenceResponse = lambda tensors=(), error=None: (list(tensors), error)  # type: ignore[attr-defined]
    fake.TritonError = str  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    space: dict[str, object] = {}
    exec(OWN_MODELS["dyna_sequence"]["model.py"], space)
    model = space["TritonPythonModel"]()  # type: ignore[operator]
    model.initialize({"model_config": json.dumps({"parameters": {}})})
    return model


def test_dyna_sequence_stand_in_keeps_an_accumulator_per_correlation_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    model = _dyna_sequence_stand_in(monkeypatch)

    def step(corrid: object, values: list[int], start: int = 0, end: int = 0) -> _Request:
        ctrl = {n: np.array([[v]], dtype=np.int32) for n, v in (("START", start), ("END", end), ("READY", 1))}
        return _Request(INPUT=np.array([values], dtype=np.int32), CORRID=np.array([[corrid]]), **ctrl)

    def outputs(*requests: _Request) -> list[object]:
        answers = model.execute(list(requests))  # type: ignore[attr-defined]
        return [a[1] if a[1] else a[0][0].array.tolist() for a in answers]

    assert outputs(step(np.uint64(7), [1, 2], start=1), step(b"9", [5], start=1)) == [[[3, 3]], [[5]]]
    assert outputs(step(np.uint64(7), [4]), step(b"9", [6], end=1)) == [[[7]], [[20]]]  # 5 + 6 + ID 9
    assert outputs(step(np.uint64(7), [1], end=1)) == [[[15]]]  # 7 + 1 + ID 7, then forgotten
    assert outputs(step(np.uint64(7), [2])) == [[[2]]]
    (twice, same) = outputs(step(np.uint64(3), [1], start=1), step(np.uint64(3), [1]))
    assert twice == [[1]] and "multiple inferences requests for the same Correlation ID" in str(same)
    assert "decodable into an integer" in str(outputs(step(b"x", [1], start=1))[0])


@pytest.mark.parametrize("code", [0, 3])
def test_a_script_run_is_one_case_that_passes_on_exit_status_zero(tmp_path: Path, code: int) -> None:
    """``L0_sequence_stress``' test file is a script: ``test.sh`` reads its exit status."""
    (tmp_path / "stress.py").write_text(
        f"import sys\nprint('working')\nprint('it went so')\nsys.exit({code})\n"
    )
    junit = tmp_path / "out.xml"
    assert unittest_junit.main([f"--junit={junit}", "--script", str(tmp_path / "stress.py")]) == code
    (outcome,) = parse_junit_text(junit.read_text())
    assert outcome.test_id == "stress.main"
    assert outcome.status == ("passed" if code == 0 else "failed")
    if code:
        assert "exit status 3: it went so" in outcome.message


def test_the_sequence_stand_in_accumulates_per_slot_as_tritons_sequence_backend() -> None:
    """The runner's stand-in for ``src/test/sequence``: START sets a slot's sum, READY adds, padding
    (READY 0) leaves it."""
    import types

    import numpy as np

    from tools.triton_qa import sequence_stress  # noqa: F401  (registers the stand-in)

    class _Tensor:
        def __init__(self, name: str, value: object) -> None:
            self.name, self.value = name, np.asarray(value)

        def as_numpy(self) -> np.ndarray:
            return self.value

    utils = types.SimpleNamespace(
        get_input_tensor_by_name=lambda r, n: r[n],
        Tensor=_Tensor,
        InferenceResponse=lambda tensors: {t.name: t.value for t in tensors},
    )
    namespace: dict[str, object] = {"pb_utils": utils}
    code = OWN_MODELS["sequence"]["1/model.py"].replace("import triton_python_backend_utils as pb_utils", "")
    exec(compile(code, "model.py", "exec"), namespace)
    model = namespace["TritonPythonModel"]()  # type: ignore[operator]
    model.initialize({"model_config": json.dumps({"max_batch_size": 2})})

    def row(start: int, ready: int, value: int) -> dict[str, _Tensor]:
        return {
            "START": _Tensor("START", [[start]]),
            "READY": _Tensor("READY", [[ready]]),
            "INPUT": _Tensor("INPUT", [[value]]),
        }

    out = model.execute([row(1, 1, 5), row(1, 1, 7)])
    assert [o["OUTPUT"].tolist() for o in out] == [[[5]], [[7]]]
    out = model.execute([row(0, 0, 100), row(0, 1, 3)])  # slot 0 padded
    assert [o["OUTPUT"].tolist() for o in out] == [[[5]], [[10]]]
    assert model.execute([row(0, 1, 1)])[0]["OUTPUT"].tolist() == [[6]]


def test_model_queue_writes_each_tests_batching_block_on_the_python_identity(tmp_path: Path) -> None:
    from repository_loader.config import parse_config
    from repository_loader.findings import Findings
    from repository_loader.validation import check_dynamic_batching

    checkout, cache = tmp_path / "checkout", tmp_path / "cache"
    custom = checkout / "qa" / "custom_models" / "custom_zero_1_float32"
    ensemble = checkout / "qa" / "L0_model_queue" / "ensemble_zero_1_float32"
    for folder in (custom, ensemble):
        folder.mkdir(parents=True)
    custom.joinpath("config.pbtxt").write_text(
        'name: "custom_zero_1_float32"\nbackend: "identity"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0"\n data_type: TYPE_FP32\n dims: [ 1 ]\n} ]\n'
        'output [ { name: "OUTPUT0"\n data_type: TYPE_FP32\n dims: [ 1 ]\n} ]\n'
    )
    ensemble.joinpath("config.pbtxt").write_text('name: "ensemble_zero_1_float32"\nplatform: "ensemble"\n')
    runs = {run.label: run for run in model_queue.L0_MODEL_QUEUE.runs}
    assert len(runs) == 7 and all(run.server_per_test and len(run.tests) == 1 for run in runs.values())
    built = build_repository(runs["test_max_priority_levels"].models, checkout, cache, tmp_path / "repo")
    assert not built.skipped
    assert (built.path / "ensemble_zero_1_float32" / "1").is_dir()
    assert (built.path / "custom_zero_1_float32" / "1" / "model.py").read_text() == OWN_MODELS["identity"][
        "1/model.py"
    ]
    config = parse_config((built.path / "custom_zero_1_float32" / "config.pbtxt").read_text())
    assert config.backend == "python" and config.max_batch_size == 32
    assert list(config.input[0].dims) == [-1] and list(config.output[0].dims) == [-1]
    assert config.dynamic_batching.priority_levels == 2**64 - 1
    assert config.dynamic_batching.default_priority_level == 2**32
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    findings = Findings("custom_zero_1_float32", "config.pbtxt")
    check_dynamic_batching(config, findings)
    assert not findings.errors

    built = build_repository(runs["test_priority_with_policy"].models, checkout, cache, tmp_path / "repo2")
    config = parse_config((built.path / "custom_zero_1_float32" / "config.pbtxt").read_text())
    policy = config.dynamic_batching.priority_queue_policy[2]
    assert policy.default_timeout_microseconds == 11000000 and policy.allow_timeout_override
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 32]


def test_iterative_sequence_stand_in_counts_down_as_a_python_based_backend(tmp_path: Path) -> None:
    import asyncio

    import numpy as np

    from deployments.backends.registry import create_backend
    from repository_loader import load_model
    from tests.backends.helpers import context, request

    suite_dir = tmp_path / "qa" / "L0_iterative_sequence"
    iterative_sequence.prepare(suite_dir, lambda model, folder: None)
    repo = tmp_path / "models"
    (repo / "iterative_sequence" / "1").mkdir(parents=True)
    (repo / "iterative_sequence" / "config.pbtxt").write_text(
        'backend: "iterative_sequence"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "model_transaction_policy { decoupled: true }\nsequence_batching { iterative_sequence: true }\n"
    )
    model = load_model(repo, "iterative_sequence", backend_directory=suite_dir / iterative_sequence.BACKENDS)
    assert model.kind == "python" and model.decoupled
    backend = create_backend(context(model))
    backend.load()

    async def stream() -> list:
        call = request("iterative_sequence", INPUT=np.array([[2]], dtype=np.int32))
        call.correlation_id = 7
        return [r async for r in backend.stream(call)]

    try:
        responses = asyncio.run(stream())
    finally:
        backend.unload()
    assert [r.outputs["OUTPUT"].tolist() for r in responses] == [[[1]], [[0]]]
    assert [r.final for r in responses] == [False, True]
