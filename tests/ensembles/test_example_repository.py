"""The bundled example ensemble passes the graph rules and gets a placement."""

from __future__ import annotations

from pathlib import Path

from ensembles import build_graph, choose_placement, describe_placement
from ensembles.handoff import Route
from repository_loader.repository import load_repository

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
