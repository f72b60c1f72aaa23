"""The bundled example ensemble passes the graph rules, gets a placement and runs in one replica."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deployments.backends.base import BackendContext
from deployments.inference import InferRequest, InferResponse
from ensembles import EnsembleScheduler, build_graph, choose_placement, describe_placement
from ensembles.backend import EnsembleBackend
from ensembles.handoff import Route
from repository_loader.errors import Unavailable
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
    assert placement.hosted == "cpu"
    assert placement.hosted_models() == {"image_preprocess": "cpu", "crnn": "cpu", "crnn_postprocess": "cpu"}
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


class _Refusing:
    async def infer(self, request: InferRequest) -> InferResponse:
        return InferResponse(error=Unavailable(f"'{request.model_name}' was sent out of the replica"))


async def test_text_recognition_hosted_in_its_replica_equals_its_steps_run_by_hand() -> None:
    """The default placement loads all three CPU models in the ensemble's replica: no step leaves it."""
    state = load_repository(REPOSITORY)
    ens = state.models["text_recognition"]
    names = ["image_preprocess", "crnn", "crnn_postprocess"]
    backend = EnsembleBackend(BackendContext(ens, 1, executor=_Refusing()), state.models)
    backend.load()
    by_hand = BackendExecutor({n: state.models[n] for n in names})
    try:
        await backend.start()
        assert list(backend.hosted) == names
        image = np.random.default_rng(1).integers(0, 255, (3, 48, 150), dtype=np.uint8)
        (response,) = await backend.execute([InferRequest("text_recognition", {"IMAGE": image})])
        assert response.error is None, response.error.message
        pre = await by_hand.infer(InferRequest("image_preprocess", {"IMAGE": image}))
        crnn = await by_hand.infer(InferRequest("crnn", {"input.1": pre.outputs["PREPROCESSED"]}))
        post = await by_hand.infer(InferRequest("crnn_postprocess", {"LOGITS": crnn.outputs["308"]}))
        np.testing.assert_array_equal(response.outputs["TEXT"], post.outputs["TEXT"])
        assert response.outputs["TEXT"].shape == (3, 1)
        assert [s["inference_count"] for s in backend.hosted_statistics()] == [3, 3, 3]
    finally:
        await backend.stop()
        backend.unload()
        by_hand.close()
