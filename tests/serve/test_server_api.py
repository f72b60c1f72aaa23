"""Every call between replicas and the server application names a deployment method that exists, with
arguments its signature takes (no Ray running: the clients are driven over a recording handle)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from deployments.inference import InferRequest
from deployments.serve.server_api import ReplicaClient, ServerClient


class Recorder:
    """A deployment handle: ``handle.<method>.remote(*args)`` records the call and answers ``answer``."""

    def __init__(self, answer: Any = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answer = answer

    def options(self, **_: Any) -> Recorder:
        return self

    def __getattr__(self, method: str) -> Any:
        recorder = self

        class Method:
            def remote(self, *args: Any) -> Any:
                recorder.calls.append((method, args))

                async def answer() -> Any:
                    return recorder.answer

                return answer()

        return Method()


def _deployment_class(name: str) -> type:
    from deployments.serve.app import ServerDeployment
    from deployments.serve.model_app import ModelDeployment
    from deployments.serve.model_host import ModelHostDeployment

    deployment = {"server": ServerDeployment, "model": ModelDeployment, "host": ModelHostDeployment}[name]
    return deployment.func_or_class  # type: ignore[attr-defined, no-any-return]


def _public(cls: type) -> list[str]:
    return [n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")]


ARGS: dict[str, tuple[Any, ...]] = {
    "model_apps": ("m",),
    "pooled": ("m",),
    "pool_generations": (),
    "describe": ("m", "1"),
    "model_statistics": ("m", "1"),
    "sequence_register": ("m", 1, ("model-m", "actor")),
    "sequence_members": ("m",),
    "report_stats": ("m", "r", []),
    "report_metrics": ("m", "r", {"stats": []}),
    "report_host": ("r", {}),
    "cluster_stats": ("m", "r", [], True),
    "reload_order": ("m", (0, ""), 1.0),
    "reload_report": ("m", 1, "r", "prepare", None),
    "control_load": ("m", "", {}),
    "control_unload": ("m", False),
    "control_is_ready": ("m", ""),
    "index": (),
    "deployed_plan": (),
    "is_started": (),
    "log_settings": (None, 1.0),
    "shm_region": ("r", "replica"),
    "shm_follow": ("replica", 1, 30.0, None),
    "shm_register": ("r", "/key", 0, 64),
    "shm_unregister": ("r",),
    "shm_status": ("",),
    "trace_settings": ("m",),
    "trace_update": (None, {"trace_rate": 1}),
    "trace_take": ("m",),
    "trace_state": ("r", 0, 1.0),
    "hold_report": ("m", "r/0", 1, 0, 2, 0),
    "hold_forget": ("m", "r/0"),
    "infer_internal": (InferRequest("m", {}),),
    "infer_stream_internal": (InferRequest("m", {}),),
    "load_status": (),
    "description": (),
    "metrics_snapshot": (),
    "stats_snapshot": (),
}


@pytest.mark.parametrize(
    ("client_cls", "deployment"),
    [(ServerClient, "server"), (ReplicaClient, "model")],
    ids=["server", "replica"],
)
async def test_each_client_method_calls_the_deployment_method_of_its_name(
    client_cls: type, deployment: str
) -> None:
    cls = _deployment_class(deployment)
    methods = _public(client_cls)
    assert methods, "the client has methods"
    for method in methods:
        recorder = Recorder(answer=[] if method in ("model_apps",) else {})
        client = client_cls(recorder)
        result = getattr(client, method)(*ARGS[method])
        if inspect.isawaitable(result):
            await result
        assert [name for name, _ in recorder.calls] == [method], method
        target = getattr(cls, method, None)
        assert target is not None, f"{cls.__name__} has no method {method}"
        inspect.signature(target).bind(None, *recorder.calls[0][1])  # raises on a mismatch


def test_every_method_the_replicas_and_the_server_call_is_covered() -> None:
    assert set(_public(ServerClient)) | set(_public(ReplicaClient)) == set(ARGS)


async def test_a_model_host_answers_the_inference_calls_other_replicas_make() -> None:
    """``RemoteModels`` reaches a pooled model through the host application's handle where it cannot
    call a host replica's HTTP port: the host deployment has those methods, with their signatures."""
    cls = _deployment_class("host")
    for method in ("infer_internal", "infer_stream_internal"):
        recorder = Recorder()
        result = getattr(ReplicaClient(recorder), method)(*ARGS[method])
        if inspect.isawaitable(result):
            await result
        inspect.signature(getattr(cls, method)).bind(None, *recorder.calls[0][1])


async def test_each_held_scheduler_reports_to_the_server_under_its_own_name() -> None:
    """``ServerHolds`` (TRITONSERVER_DELAY_SCHEDULER over a model's replicas): a scheduler's counts go to
    the server application's ``hold_report`` with the hold, under a name no other scheduler has."""
    from deployments.serve.server_api import ServerHolds

    recorder = Recorder(answer=True)
    holds = ServerHolds(ServerClient(recorder), "replica-a")
    first, second = holds("m", 12, 2), holds("m", 12, 2)
    assert await first.reached(5, 1) is True
    await second.reached(3, 0)
    await first.forget()
    assert recorder.calls == [
        ("hold_report", ("m", "replica-a/0", 5, 1, 12, 2)),
        ("hold_report", ("m", "replica-a/1", 3, 0, 12, 2)),
        ("hold_forget", ("m", "replica-a/0")),
    ]
