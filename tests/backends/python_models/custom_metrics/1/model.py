"""Custom metrics and the logger: counts requests, tracks the last input size, histograms values."""

import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.logger = pb_utils.Logger
        self.requests_family = pb_utils.MetricFamily(
            name="custom_requests_total",
            description="Requests this model executed",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.size_family = pb_utils.MetricFamily(
            name="custom_last_input_size",
            description="Elements of the last input",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.value_family = pb_utils.MetricFamily(
            name="custom_input_value",
            description="Input values",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = self.requests_family.Metric(labels=labels)
        self.size = self.size_family.Metric(labels=labels)
        self.values = self.value_family.Metric(labels=labels, buckets=[1.0, 5.0, 10.0])
        # the family object must outlive its metrics (tritonserver deletes a dropped family)
        self.latency_family = pb_utils.MetricFamily(
            name="custom_execute_latency_ns",
            description="Cumulative time spent in execute",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.latency = self.latency_family.Metric(labels=labels)
        self.logger.log_info("initialized")

    def execute(self, requests):
        start_ns = time.time_ns()
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.requests.increment(1)
            self.size.set(data.size)
            for value in data.reshape(-1):
                self.values.observe(float(value))
            self.logger.log_verbose(f"request of {data.size} values")
            total = np.array([self.requests.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("COUNT", total)]))
        self.logger.log("executed", pb_utils.Logger.INFO)
        self.logger.log_warn("a warning")
        self.logger.log_error("an error")
        self.latency.increment(time.time_ns() - start_ns)
        return responses
