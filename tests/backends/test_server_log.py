"""In a served replica, the server's own warnings and errors (a model's execute raising) and the models'
``pb_utils.Logger`` lines reach the process's real standard error, which Ray forwards to the server's
log, as tritonserver prints them in its log (Triton's L0_backend_python async_execute test reads it)."""

from __future__ import annotations

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
