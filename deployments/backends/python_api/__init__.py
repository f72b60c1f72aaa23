"""What a Python model's ``model.py`` sees as ``triton_python_backend_utils``, one module per object.

``tensor`` (Tensor, DLPack, PreferredMemory), ``dtypes`` (type tables and
BYTES serialization), ``errors`` (TritonError, TritonModelException),
``request`` (InferenceRequest), ``response`` (InferenceResponse),
``response_sender`` (decoupled responses), ``bls`` (BLS calls), ``context``
(which model's code runs, and where its BLS calls go), ``model_control``
(load/unload/readiness calls), ``logger``, ``metrics`` (MetricFamily, Metric)
and ``config`` (model config helpers). The top-level
``triton_python_backend_utils`` module re-exports their public names.
"""
