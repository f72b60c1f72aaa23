"""``pb_utils.InferenceResponse``: output tensors or an error, as a model answers a request.

The backend turns a model's response into the server's response
(:meth:`InferenceResponse.to_server`); a BLS call turns the server's response
into one for the calling model (:meth:`InferenceResponse.from_server`).
"""

from __future__ import annotations

import json
from typing import Any

from deployments.backends.python_api.errors import (
    TritonError,
    TritonModelException,
    from_server_error,
    to_server_error,
)
from deployments.backends.python_api.tensor import PreferredMemory, Tensor
from deployments.inference import InferResponse

_NO_TENSORS: list[Tensor] = []  # the default: no output tensors (a fresh list each time)


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] = _NO_TENSORS,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is _NO_TENSORS:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):  # None refused, as Triton's bindings refuse it
            raise TypeError(
                f'InferenceResponse(): "output_tensors" must be a list, not {type(output_tensors).__name__}'
            )
        output_tensors = list(output_tensors)
        if any(not isinstance(t, Tensor) for t in output_tensors):
            raise TritonModelException(
                'InferenceResponse(): every element of "output_tensors" must be a pb_utils.Tensor'
            )
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = parameters_json(parameters)
        self._final = True  # BLS: whether this is the last response of a decoupled model's stream

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def to_server(
        self, model_name: str, model_version: str, request_id: str, wanted: list[str]
    ) -> InferResponse:
        """The server's response; only the outputs the request asked for are kept, as in Triton."""
        error = to_server_error(self._error) if self._error is not None else None
        outputs = {} if error else {t.name(): t.data() for t in self._output_tensors if t.name() in wanted}
        return InferResponse(
            outputs=outputs,
            error=error,
            parameters=json.loads(self._parameters),
            model_name=model_name,
            model_version=model_version,
            id=request_id,
        )

    @staticmethod
    def from_server(response: InferResponse, memory: PreferredMemory | None = None) -> InferenceResponse:
        """A BLS call's response; ``memory`` moves its outputs where the caller prefers them."""
        if response.error is not None:
            converted = InferenceResponse([], error=from_server_error(response.error))
        else:
            place = memory.place if memory is not None else _same
            tensors = [Tensor(name, place(data)) for name, data in response.outputs.items()]
            converted = InferenceResponse(tensors, parameters=dict(response.parameters))
        converted._final = response.final
        return converted


def _same(data: Any) -> Any:
    return data


def parameters_json(parameters: dict[str, Any] | str | None) -> str:
    """Parameters as a JSON object string: from a dict of bool, int or str values, or a JSON string.

    Requests and responses take their ``parameters`` in these forms alike.
    """
    if parameters is None:
        return "{}"
    if isinstance(parameters, (str, bytes)):
        try:
            decoded = json.loads(parameters)
        except ValueError as error:
            raise TritonModelException(f"parameters must be a JSON object: {error}") from None
        if not isinstance(decoded, dict):
            raise TritonModelException("parameters must be a JSON object")
        return parameters if isinstance(parameters, str) else parameters.decode()
    if not isinstance(parameters, dict):
        raise TritonModelException(
            f"parameters must be a dict or a JSON string, not {type(parameters).__name__}"
        )
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"parameter {key!r}: keys must be str and values bool, int or str, not {type(value).__name__}"
            )
    return json.dumps(parameters)
