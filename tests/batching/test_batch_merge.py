"""Joining a batch's inputs by rows and cutting outputs back per request."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.batch_merge import merge_inputs, split_outputs
from repository_loader.errors import InternalError, InvalidArgument
from tests.batching.fakes import request


def test_merge_then_split_gives_each_request_its_rows() -> None:
    reqs = [request("a", rows=3, value=1), request("b", rows=1, value=2), request("c", rows=2, value=3)]
    merged = merge_inputs(reqs)
    assert merged.rows == (3, 1, 2) and merged.inputs["IN"].shape == (6, 2)
    parts = split_outputs({"OUT": merged.inputs["IN"] * 10}, merged.rows)
    assert [p["OUT"][:, 0].tolist() for p in parts] == [[10, 10, 10], [20], [30, 30]]


def test_single_request_is_not_copied() -> None:
    req = request("a", rows=2)
    assert merge_inputs([req]).inputs["IN"] is req.inputs["IN"]


def test_ragged_inputs_are_flattened_and_concatenated() -> None:
    merged = merge_inputs([request("a", width=2), request("b", width=3)], ragged=frozenset({"IN"}))
    assert merged.inputs["IN"].shape == (5,)


def test_requests_with_different_inputs_cannot_merge() -> None:
    other = request("b")
    other.inputs = {"OTHER": other.inputs["IN"]}
    with pytest.raises(InvalidArgument, match="different inputs"):
        merge_inputs([request("a"), other], model_name="m")


def test_output_rows_must_match_the_batch() -> None:
    with pytest.raises(InternalError, match="output 'OUT'"):
        split_outputs({"OUT": np.zeros((3, 1))}, [1, 1], model_name="m")
