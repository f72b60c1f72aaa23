"""``L0_trace``: Triton's trace setting API (``trace_endpoint_test.py``) over HTTP and gRPC, on a
server started as ``test.sh`` starts it for that test (``triton`` mode, a trace file, level
``TIMESTAMPS``, rate 1), with the Python stand-in of ``simple``.
"""

from __future__ import annotations

from tools.triton_qa.suites import NO_SIMPLE_WHY, SIMPLE, Run, Suite, register

L0_TRACE = Suite(
    "L0_trace",
    (
        Run(
            "trace_endpoint_test",
            "trace_endpoint_test.py",
            (SIMPLE,),
            server_args=(
                "--trace-config=triton,file=global_unittest.log",
                "--trace-config=level=TIMESTAMPS",
                "--trace-config=rate=1",
            ),
        ),
    ),
    (
        ("model simple", NO_SIMPLE_WHY),
        (
            "test.sh's trace file checks (trace_summary.py over the files tritonserver writes)",
            "this server writes no trace file in triton mode; it exports OpenTelemetry spans (docs/compatibility.md)",
        ),
        (
            "opentelemetry_unittest.py",
            "needs the OpenTelemetry Collector binary that test.sh downloads from GitHub; "
            "tests/serve/test_tracing_e2e.py checks the same span trees against an OTLP receiver",
        ),
    ),
)

register(L0_TRACE)
