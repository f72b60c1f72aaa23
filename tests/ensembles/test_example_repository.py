"""The bundled example ensemble passes the graph rules and gets a placement."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deployments.inference import InferRequest
from ensembles import EnsembleScheduler, build_graph, choose_placement, describe_placement
from ensembles.handoff import Route
from repository_loader.repository import load_repository
from tests.ensembles.helpers import BackendExecutor

REPOSITORY = Path(__file__).resolve().parents[2] / "examples" / "model_repository"


def test_text_recognition_graph_and_placement() -> None:
    state = load_repository(REPOSITORY, auto_complete=False)
    graph = build_graph(state.models["text_recognition"], state.models)
    assert [s.model_name for s in graph.steps] == ["image_preprocess", "crnn", "crnn_postprocess"]
    assert [t for t, i in sorted(graph.producer.items(), key=lambda item: item[1])] == [
        "preprocessed_image",
        "logits",
        "TEXT",
    ]
    placement = choose_placement(graph)
    assert {e.route for e in placement.edges} == {Route.IN_PROCESS}
    assert describe_placement(placement)[0] == "ensemble 'text_recognition': placement colocate"


async def test_text_recognition_equals_its_steps_run_by_hand() -> None:
    state = load_repository(REPOSITORY)
    names = ["image_preprocess", "crnn", "crnn_postprocess"]
    executor = BackendExecutor({n: state.models[n] for n in names})
    scheduler = EnsembleScheduler(build_graph(state.models["text_recognition"], state.models), executor)
    image = np.random.default_rng(0).integers(0, 255, (2, 40, 120), dtype=np.uint8)
    response = await scheduler.infer(InferRequest("text_recognition", {"IMAGE": image}))
    assert response.error is None
    pre = await executor.infer(InferRequest("image_preprocess", {"IMAGE": image}))
    crnn = await executor.infer(InferRequest("crnn", {"input.1": pre.outputs["PREPROCESSED"]}))
    post = await executor.infer(InferRequest("crnn_postprocess", {"LOGITS": crnn.outputs["308"]}))
    assert post.error is None
    np.testing.assert_array_equal(response.outputs["TEXT"], post.outputs["TEXT"])
    assert response.outputs["TEXT"].shape == (2, 1)
