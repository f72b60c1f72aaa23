"""``L0_response_cache``: the response cache on an ensemble and on its composing model.

``test.sh`` starts a server for each ``EnsembleCacheTest`` method, in ``explicit`` mode with a local cache
of 10,840 bytes (200 for the insertion-failure test); each test adds ``response_cache { enable: true }``
to a configuration in ``models/ensemble_models`` (a folder of the suite it opens by that path), loads the
ensemble and its step, and reads their cache statistics. The ensemble is the generated
``simple_graphdef_float32_float32_float32`` (versions 1 and 3); its step, a TensorFlow GraphDef, is a
Python stand-in with the ONNX model's configuration of the same types, on both servers.

The rest of ``test.sh`` is the C++ ``response_cache_test`` and server starts it judges by grepping the
log (flag conflicts, Redis connection errors, the refusal of a decoupled model): not Python tests.
"""

from __future__ import annotations

from tools.triton_qa.suites import Model, Run, Suite, graphdef_stand_in, register

_ENSEMBLE = "simple_graphdef_float32_float32_float32"
MODELS = (
    graphdef_stand_in("float32_float32_float32", versions=(1, 2, 3)),
    Model(_ENSEMBLE, "generated", f"qa_ensemble_model_repository/{_ENSEMBLE}"),
)
_EXPLICIT = "--model-control-mode=explicit"
TESTS = tuple(
    f"EnsembleCacheTest.{name}"
    for name in (
        "test_ensemble_top_level_response_cache",
        "test_ensemble_all_models_cache_enabled",
        "test_ensemble_composing_model_cache_enabled",
    )
)

L0_RESPONSE_CACHE = Suite(
    "L0_response_cache",
    (
        Run(
            "ensemble_cache",
            "ensemble_cache_test.py",
            MODELS,
            server_args=("--cache-config=local,size=10840", _EXPLICIT),
            tests=TESTS,
            server_per_test=True,
            repository_at="models/ensemble_models",
        ),
        Run(
            "ensemble_cache insertion failure",
            "ensemble_cache_test.py",
            MODELS,
            server_args=("--cache-config=local,size=200", _EXPLICIT),
            tests=("EnsembleCacheTest.test_ensemble_cache_insertion_failure",),
            server_per_test=True,
            repository_at="models/ensemble_models",
        ),
    ),
    (
        (
            "model graphdef_float32_float32_float32",
            "a TensorFlow GraphDef; a Python stand-in with the ONNX model's configuration of the same types "
            "is used on both servers",
        ),
        ("response_cache_test (C++ unit test, Redis)", "a C++ binary"),
        (
            "cache flag and Redis start checks, decoupled-model refusals, 'Failed to insert key' in the log",
            "test.sh judges them by grepping the server's log or its start; not Python tests",
        ),
    ),
)

register(L0_RESPONSE_CACHE)
