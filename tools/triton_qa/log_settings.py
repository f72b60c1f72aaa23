"""``L0_logging``: the logging extension's endpoint tests, one server.

``logging_endpoint_test.py`` reads and changes the log settings over HTTP and gRPC against a server
started without log flags, as ``test.sh`` starts it. Its repository holds ``simple``, Triton's ONNX
``onnx_int32_int32_int32`` renamed; the tests never call a model, so the Python stand-in for ``simple``
(the same inputs and outputs) serves on both servers. ``log_format_test.py`` is left out: it starts and
kills ``tritonserver`` itself (see the suite's "Cannot run here").
"""

from __future__ import annotations

from tools.triton_qa.suites import SIMPLE, Run, Suite, register

L0_LOGGING = Suite(
    "L0_logging",
    (Run("logging_endpoint_test", "logging_endpoint_test.py", (SIMPLE,)),),
    (
        (
            "model simple (ONNX onnx_int32_int32_int32 in test.sh)",
            "the tests call no model; the Python stand-in with the same inputs and outputs is used on both",
        ),
        (
            "log_format_test.py",
            "it starts the tritonserver binary itself (not the server under test), waits fixed times and "
            "ends it with SIGKILL, which would leave this server's Ray processes running; it also checks "
            "that messages are JSON-escaped, which this server does not do (docs/conformance.md)",
        ),
        (
            "test.sh's log-file, log-info/warning/error and format checks",
            "test.sh greps the server's log and counts its lines with curl and the C++ example clients; "
            "not Python tests",
        ),
    ),
)

register(L0_LOGGING)
