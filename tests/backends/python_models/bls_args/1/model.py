"""BLS with the arguments of pb_utils.InferenceRequest; reports what its targets saw (JSON in REPORT).

``request_api`` gets the request id, correlation id, flags, ``timeout``, ``parameters`` and
``preferred_memory`` and tells what it received; ``multi_version`` (output = input * version) is
asked for ``model_version`` 1, 2 and -1 (the latest); ``until_cancelled`` (a response every 10 ms
until cancelled, then it writes ``<IN[0]>.cancelled`` into its marker folder) is streamed with a
2 s ``timeout``, which ends the call with an error.
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            vector = pb_utils.get_input_tensor_by_name(request, "V").as_numpy()
            report = {"request_api": self.request_api(request, values)}
            report["versions"] = {str(v): self.version(v, vector) for v in (1, 2, -1)}
            report["expired"] = self.expired(int(values[0]))
            encoded = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", encoded)]))
        return responses

    def request_api(self, request, values):
        call = pb_utils.InferenceRequest(
            model_name="request_api",
            inputs=[pb_utils.Tensor("IN", values)],
            requested_output_names=["INFO", "OUT"],
            request_id="bls-" + request.request_id(),
            correlation_id=12345,
            flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
            timeout=7_000_000,
            parameters={"caller": "bls_args", "depth": 2, "flag": True},
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        )
        response = call.exec()
        if response.has_error():
            return {"error": response.error().message()}
        info = pb_utils.get_output_tensor_by_name(response, "INFO")
        out = pb_utils.get_output_tensor_by_name(response, "OUT")
        return {
            "info": json.loads(info.as_numpy()[0]),
            "out": out.as_numpy().tolist(),
            "out_is_cpu": out.is_cpu(),
            "response_parameters": json.loads(response.parameters()),
        }

    def version(self, version, vector):
        call = pb_utils.InferenceRequest(
            model_name="multi_version",
            model_version=version,
            inputs=[pb_utils.Tensor("INPUT0", vector.reshape(1, -1))],
            requested_output_names=["OUTPUT0"],
        )
        response = call.exec()
        if response.has_error():
            return {"error": response.error().message()}
        return pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().reshape(-1).tolist()

    def expired(self, marker):
        call = pb_utils.InferenceRequest(
            model_name="until_cancelled",
            inputs=[pb_utils.Tensor("X", np.array([marker], dtype=np.int32))],
            requested_output_names=["Y"],
            timeout=2_000_000,
        )
        steps, error = [], None
        for response in call.exec(decoupled=True):
            if response.has_error():
                error = {"code": response.error().code(), "message": response.error().message()}
                break
            tensor = pb_utils.get_output_tensor_by_name(response, "Y")
            if tensor is not None:
                steps.append(int(tensor.as_numpy()[0]))
        return {"steps": steps, "error": error}
