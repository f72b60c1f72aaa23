"""In a served replica, the server's own warnings and errors (a model's execute raising) and the models'
``pb_utils.Logger`` lines reach the process's real standard error, which Ray forwards to the server's
log, as tritonserver prints them in its log (Triton's L0_backend_python async_execute test reads it)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap


def test_server_errors_and_model_lines_go_to_the_real_stderr() -> None:
    script = textwrap.dedent(
        """
        import io, logging, sys
        from deployments.backends.python_api.logger import log_to_stderr
        sys.stderr = io.StringIO()  # Serve replaces sys.stderr in a replica
        log_to_stderr()
        log_to_stderr()  # a second replica start in the same process adds nothing
        logging.getLogger("deployments.backends.python").error("Failed to process: ValueError: boom")
        logging.getLogger("deployments.backends.python").info("not at INFO")
        logging.getLogger("triton_python_backend").info("model line")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert sum("ValueError: boom" in line for line in lines) == 1, lines
    assert lines[0].startswith("E") and "not at INFO" not in done.stderr
    assert sum("model line" in line for line in lines) == 1


def test_the_lines_tritonserver_writes_at_info_show_as_its_info_flag_says() -> None:
    """``successfully loaded '<model>'`` (L0_lifecycle counts it in the server's log) shows without
    verbose logging, as tritonserver's does, and goes with --log-info=false; the server's other INFO
    lines stay for verbose logging."""
    script = textwrap.dedent(
        """
        import io, logging, sys
        from deployments.backends.python_api.logger import log_to_stderr
        from deployments.settings import TRITON_LINE, LogSettings
        sys.stderr = io.StringIO()
        log = logging.getLogger("deployments.control.loading")
        log_to_stderr()
        log.info("successfully loaded '%s'", "m", extra={TRITON_LINE: True})
        log.info("an internal step")
        log_to_stderr(LogSettings(info=False))
        log.info("successfully unloaded '%s'", "m", extra={TRITON_LINE: True})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.match(r'I\d{4} [\d:.]+ \d+ <string>:\d+] "successfully loaded \'m\'"$', done.stderr.strip())
    assert "an internal step" not in done.stderr and "unloaded" not in done.stderr


def test_tritons_log_flags_choose_the_levels_the_form_and_the_file(tmp_path) -> None:
    """--log-verbose shows the models' verbose lines and the server's debug lines; --log-info=false hides
    INFO; --log-format=ISO8601 and --log-file change the form and the place, as in tritonserver."""
    log = tmp_path / "server.log"
    script = textwrap.dedent(
        f"""
        import logging
        import triton_python_backend_utils as pb_utils
        from deployments.backends.python_api.logger import log_to_stderr
        from deployments.settings import LogSettings, ServerSettings

        settings = ServerSettings.from_args(
            {{"model_repository": "{tmp_path}", "log_verbose": 1, "log_format": "ISO8601", "log_file": "{log}"}}
        )
        log_to_stderr(settings.log_settings)
        pb_utils.Logger.log_verbose("verbose line")
        logging.getLogger("deployments.runtime").debug("server debug line")
        log_to_stderr(LogSettings(info=False, verbose_level=1))
        pb_utils.Logger.log_info("hidden info line")
        pb_utils.Logger.log_warn("shown warning line")
        log_to_stderr(LogSettings())
        logging.getLogger("deployments.runtime").debug("no more debug lines")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written = log.read_text()
    assert "verbose line" in written and "server debug line" in written
    assert written.splitlines()[0][:4].isdigit() and "T" in written.splitlines()[0][:20]  # 2026-11-26T...
    # --log-info=false hides INFO lines with verbose logging on too, as in tritonserver
    assert "hidden info line" not in done.stderr and "shown warning line" in done.stderr
    assert "no more debug lines" not in done.stderr  # verbose off again: the server's debug lines stop
    assert re.match(
        r'W\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ <string>:\d+] "shown warning line"$', done.stderr.strip()
    )


def test_lines_take_tritons_two_forms() -> None:
    """``<L><mmdd> <time with microseconds> <pid> <file>:<line>] <message>``, and ISO8601's
    ``<date>T<time>Z <L> <pid> <file>:<line>] <message>``; a verbose line shows as I, as in Triton."""
    import logging

    from deployments.backends.python_api.logger import TritonLogForm

    record = logging.LogRecord("deployments.x", logging.DEBUG, "/src/model.py", 12, "a %s", ("line",), None)
    record.created, record.process = 1764174225.5, 42
    assert TritonLogForm().format(record) == 'I1126 16:23:45.500000 42 model.py:12] "a line"'
    assert TritonLogForm(iso8601=True).format(record) == '2025-11-26T16:23:45Z I 42 model.py:12] "a line"'
    assert TritonLogForm(escape=False).format(record) == "I1126 16:23:45.500000 42 model.py:12] a line"


def test_a_message_is_one_json_string_unless_escaping_is_off() -> None:
    """tritonserver writes each message as a JSON string (``TRITON_SERVER_ESCAPE_LOG_MESSAGES``, on
    unless "0"): a tab, a quote, a newline or a terminal escape in a message cannot break or forge a
    record; a traceback is part of the string. Off, the message is written as logged."""
    import json
    import logging
    import sys

    from deployments.backends.python_api.logger import TritonLogForm
    from deployments.settings import ServerSettings

    forged = 'Resource: R1\t Count: 3\nE1126 00:00:00.000000 1 x.cc:1] "forged" \x1b[31mred'
    record = logging.LogRecord("deployments.x", logging.INFO, "/src/m.py", 3, forged, (), None)
    line = TritonLogForm().format(record)
    assert "\n" not in line and "\t" not in line and "\x1b" not in line
    assert "Resource: R1\\t Count: 3" in line  # the literal backslash-t Triton's qa tests look for
    assert json.loads(line.split("] ", 1)[1]) == forged
    try:
        raise ValueError('bad "input"')
    except ValueError:
        failed = logging.LogRecord(
            "deployments.x", logging.ERROR, "/src/m.py", 4, "failed", (), sys.exc_info()
        )
    message = json.loads(TritonLogForm().format(failed).split("] ", 1)[1])
    assert message.startswith("failed\nTraceback") and 'ValueError: bad "input"' in message
    assert TritonLogForm(escape=False).format(record).endswith("] " + forged)
    root = {"model_repository": "/tmp"}
    assert ServerSettings.from_args(root, environ={}).log_settings.escape
    for off in ("0", "false", "FALSE"):
        environ = {"TRITON_SERVER_ESCAPE_LOG_MESSAGES": off}
        assert not ServerSettings.from_args(root, environ=environ).log_settings.escape
    assert ServerSettings.from_args(root, environ={"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "1"}).log_escape


def test_the_log_flags_are_checked_at_start(tmp_path) -> None:
    import pytest

    from deployments.settings import ServerSettings, SettingsError

    settings = ServerSettings.from_args({"model_repository": str(tmp_path), "log_info": "false"})
    assert not settings.log_info and settings.to_args()["log_info"] is False
    with pytest.raises(SettingsError, match="log_format must be 'default' or 'ISO8601'"):
        ServerSettings.from_args({"model_repository": str(tmp_path), "log_format": "json"})


def test_the_launcher_prints_every_log_line_without_rays_deduplication() -> None:
    """Ray's driver would fold lines differing only in numbers ("Resource: R1\\t Count: 3" after
    "... Count: 2", every replica's "ready") into "[repeated Nx]"; the launcher turns that off before
    Ray is imported, unless the user set it."""
    import os
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "import deployments.serve.launch as launch\n"
        "assert 'ray._private.ray_constants' not in sys.modules\n"
        "launch.configure_environment()\n"
        "from ray._private import ray_constants\n"
        "print(os.environ['RAY_DEDUP_LOGS'], ray_constants.RAY_DEDUP_LOGS)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_DEDUP_LOGS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "False"]
    env["RAY_DEDUP_LOGS"] = "1"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "True"]
