"""Request headers forwarded to the model as request parameters (Triton's ``--http-header-forward-pattern``
and ``--grpc-header-forward-pattern``, compiled by :func:`deployments.settings.compile_header_pattern`).

A header whose name the pattern matches (anywhere in the name) becomes a string parameter of the
inference request, under the header's name; a model reads it with ``request.parameters()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from deployments.inference import InferRequest


def forward_headers(
    request: InferRequest, pattern: re.Pattern[str] | None, headers: Iterable[tuple[str, str]]
) -> None:
    """Add each of ``headers`` whose name ``pattern`` matches to ``request.parameters`` (as a string)."""
    if pattern is None:
        return
    for name, value in headers:
        if pattern.search(name):
            request.parameters[name] = value
