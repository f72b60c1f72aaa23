"""``L0_metrics``: ``--metrics-config`` turning the latency counters off and the latency summaries on.

``test.sh`` starts the server five times on ``unit_test_models`` (explicit model control, one model
loaded) with different ``--metrics-config`` settings and runs some ``MetricsConfigTest`` methods against
each, which look for the counter, summary and cache families in ``/metrics``. Both models are on Triton's
C++ identity backend: here Python identities with the same configurations, on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

_FOLDER = "qa/L0_metrics/unit_test_models"


def _identity(name: str) -> Model:
    return Model(
        name,
        "folder",
        f"{_FOLDER}/{name}",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
        version_folders=("1",),
    )


MODELS = (_identity("identity_cache_off"), _identity("identity_cache_on"))
_EXPLICIT = ("--model-control-mode=explicit",)
_OFF = ("--load-model=identity_cache_off",)
_SUMMARIES = ("--metrics-config=summary_latencies=true",)
QUANTILES = "0.1:0.0.1,0.7:0.01,0.75:0.01"  # as test.sh writes them (0.0.1 reads as 0.0)


def _tests(*names: str) -> tuple[str, ...]:
    return tuple(f"MetricsConfigTest.test_{name}" for name in names)


_NO_CACHE = ("cache_counters_missing", "cache_summaries_missing")

# metrics_queue_size_test.py: identity_delay (an identity that takes 2 s per batch) once per scheduler
_DELAY = "qa/L0_metrics/identity_delay"
_QUEUE_DELAY_US = 100000


def _delayed(name: str, append: str = "") -> Model:
    return Model(
        name,
        "folder",
        _DELAY,
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
        append=append,
    )


_DYNAMIC = f"dynamic_batching {{ max_queue_delay_microseconds: {_QUEUE_DELAY_US} }}\n"
QUEUE_SIZE_MODELS = (
    _delayed("default"),
    _delayed("dynamic", _DYNAMIC),
    _delayed(
        "max_queue_size",
        f"dynamic_batching {{ max_queue_delay_microseconds: {_QUEUE_DELAY_US} "
        "default_queue_policy { max_queue_size: 4 } }\n",
    ),
    _delayed(
        "sequence_direct",
        f"sequence_batching {{ direct {{ max_queue_delay_microseconds: {_QUEUE_DELAY_US}, "
        "minimum_slot_utilization: 1.0 } }\n",
    ),
    _delayed(
        "sequence_oldest",
        f"sequence_batching {{ oldest {{ max_queue_delay_microseconds: {_QUEUE_DELAY_US}, "
        "max_candidate_sequences: 4 } }\n",
    ),
    Model("ensemble", "folder", "qa/L0_metrics/ensemble_delay", version_folders=("1",)),
    _delayed("default_composing"),
    _delayed("dynamic_composing", _DYNAMIC),
)

L0_METRICS = Suite(
    "L0_metrics",
    (
        Run(
            "defaults",
            "metrics_config_test.py",
            MODELS,
            server_args=(*_EXPLICIT, *_OFF),
            tests=_tests("inf_counters_exist", "inf_summaries_missing", *_NO_CACHE),
        ),
        Run(
            "summaries on",
            "metrics_config_test.py",
            MODELS,
            server_args=(*_EXPLICIT, *_OFF, *_SUMMARIES),
            tests=_tests("inf_counters_exist", "inf_summaries_exist", *_NO_CACHE),
        ),
        Run(
            "summaries on, counters off",
            "metrics_config_test.py",
            MODELS,
            server_args=(*_EXPLICIT, *_OFF, *_SUMMARIES, "--metrics-config=counter_latencies=false"),
            tests=_tests("inf_counters_missing", "inf_summaries_exist", *_NO_CACHE),
        ),
        Run(
            "response cache",
            "metrics_config_test.py",
            MODELS,
            server_args=(
                *_EXPLICIT,
                "--cache-config=local,size=1048576",
                "--load-model=identity_cache_on",
                *_SUMMARIES,
                "--metrics-config=counter_latencies=true",
            ),
            tests=_tests(
                "inf_counters_exist",
                "inf_summaries_exist_with_cache",
                "cache_counters_exist",
                "cache_summaries_exist",
            ),
        ),
        Run(
            "custom quantiles",
            "metrics_config_test.py",
            MODELS,
            server_args=(*_EXPLICIT, *_OFF, *_SUMMARIES, f"--metrics-config=summary_quantiles={QUANTILES}"),
            env=env(SUMMARY_QUANTILES=QUANTILES),
            tests=_tests("summaries_custom_quantiles"),
        ),
        Run(
            "pending request count",
            "metrics_queue_size_test.py",
            QUEUE_SIZE_MODELS,
            server_args=("--log-verbose=1",),
        ),
    ),
    (
        (
            "models identity_cache_on, identity_cache_off, identity_delay",
            "on Triton's C++ identity backend; Python identities with the same configurations are used on "
            "both servers",
        ),
        ("cpu_metrics_test.py, GPU, pinned-memory and metrics-interval checks", "need a GPU or grep the log"),
        ("model namespacing runs", "--model-namespacing is not supported by this server"),
    ),
)

register(L0_METRICS)
