"""The protocol front ends: KServe v2 over HTTP (with Triton's extensions) over one data plane.

- ``dataplane``: the transport-neutral :class:`DataPlane` the front ends call, and its one
  implementation :class:`ModelDataPlane` over a :class:`ModelRegistry` of :class:`ServedModel`.
- ``codec``: infer request and response bodies (JSON and binary tensors).
- ``compression``: gzip / deflate bodies.
- ``http``: the route table and the bare ASGI applications.
"""

from deployments.protocol.dataplane import DataPlane, ModelDataPlane, ModelRegistry, ServedModel
from deployments.protocol.http import MODEL_ROUTES, SERVER_ROUTES, ModelHTTPApp, ServerHTTPApp

__all__ = [
    "MODEL_ROUTES",
    "SERVER_ROUTES",
    "DataPlane",
    "ModelDataPlane",
    "ModelHTTPApp",
    "ModelRegistry",
    "ServedModel",
    "ServerHTTPApp",
]
