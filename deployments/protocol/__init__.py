"""The protocol front ends: KServe v2 over HTTP (with Triton's extensions) over one data plane.

- ``dataplane``: the transport-neutral :class:`DataPlane` the front ends call.
- ``codec``: infer request and response bodies (JSON and binary tensors).
- ``compression``: gzip / deflate bodies.
- ``schema``: a model's inputs and outputs compiled for request checks.
- ``http``: the route table and the bare ASGI applications.
"""

from deployments.protocol.dataplane import DataPlane
from deployments.protocol.http import MODEL_ROUTES, SERVER_ROUTES, ModelHTTPApp, ServerHTTPApp

__all__ = ["MODEL_ROUTES", "SERVER_ROUTES", "DataPlane", "ModelHTTPApp", "ServerHTTPApp"]
