"""Inference on another model's replicas through Serve deployment handles (BLS, ensembles)."""

from __future__ import annotations

from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.serve.names import MODEL_DEPLOYMENT, model_app_name
from repository_loader.errors import NotFound, ServerError, Unavailable


class HandleExecutor:
    """A ``ModelExecutor`` that calls the target model's own deployment."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}

    def _handle(self, model: str) -> Any:
        handle = self._handles.get(model)
        if handle is None:
            from ray import serve

            try:
                handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=model_app_name(model))
            except Exception:
                raise NotFound(f"Request for unknown model: '{model}' is not found") from None
            self._handles[model] = handle
        return handle

    async def infer(self, request: InferRequest) -> InferResponse:
        handle = self._handle(request.model_name)
        try:
            return await handle.infer_internal.remote(request)
        except ServerError:
            raise
        except Exception as exc:
            cause = getattr(exc, "cause", None) or getattr(exc, "__cause__", None)
            if isinstance(cause, ServerError):
                raise cause from None
            self._handles.pop(request.model_name, None)
            raise Unavailable(f"model '{request.model_name}' is unavailable: {exc}") from None
