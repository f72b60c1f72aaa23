"""``L0_server_status``: server and model metadata, and unknown models and versions, over HTTP and gRPC.

``test.sh`` starts one server in ``poll`` mode on Triton's whole ``qa_model_repository`` and runs
``ServerMetadataTest``; it then deletes and adds version folders and runs ``ModelMetadataTest``. The
tests that run here ask only for ``graphdef_int32_int8_int8``'s metadata: a Python stand-in with the
ONNX model's configuration of the same types, on both servers. ``TRITON_SERVER_VERSION`` (set in Triton's
qa image) is the version both servers must report.
"""

from __future__ import annotations

from tools.triton_qa.suites import Run, Suite, env, graphdef_stand_in, register

_GRAPHDEF_FIRST = "asks a TensorFlow GraphDef model first and checks its platform (tensorflow_graphdef)"

L0_SERVER_STATUS = Suite(
    "L0_server_status",
    (
        Run(
            "server_metadata",
            "server_status_test.py",
            (graphdef_stand_in("int32_int8_int8"),),
            server_args=("--repository-poll-secs=1", "--model-control-mode=poll"),
            env=env(TRITON_SERVER_VERSION="2.51.0"),
            tests=(
                "ServerMetadataTest.test_basic",
                "ServerMetadataTest.test_unknown_model",
                "ServerMetadataTest.test_unknown_model_version",
            ),
        ),
    ),
    (
        (
            "model graphdef_int32_int8_int8",
            "a TensorFlow GraphDef; a Python stand-in with the ONNX model's configuration of the same types "
            "is used on both servers",
        ),
        ("ServerMetadataTest.test_model_latest_infer", _GRAPHDEF_FIRST),
        ("ServerMetadataTest.test_model_specific_infer", f"{_GRAPHDEF_FIRST}, and a TensorRT plan"),
        (
            "ModelMetadataTest (test_model_versions_deleted, test_model_versions_added, "
            "test_infer_stats_no_model_version)",
            _GRAPHDEF_FIRST,
        ),
        (
            "ModelMetadataTest.test_infer_stats_no_model",
            "counts the 219 ready versions of Triton's whole qa_model_repository (every backend)",
        ),
    ),
)

register(L0_SERVER_STATUS)
