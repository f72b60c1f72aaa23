"""Run NVIDIA Triton's own black-box qa tests against tritonserver 2.51 and against this server.

The tests come from the user's checkout of Triton's server repository (tag v2.51.0); nothing of it is
kept in this project. ``python -m tools.triton_qa --triton-server <checkout> --suites L0_http`` builds
each suite's models, starts the reference server and then this one on the same repository, runs the
suite's Python tests against each and writes ``bench/results/conformance/``. See ``docs/conformance.md``.
"""
