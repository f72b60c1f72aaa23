"""Which GPU a KIND_GPU replica uses: the one its instance group names, as in Triton.

Ray gives a replica that asks for ``num_gpus`` some GPU of its node and sets
``CUDA_VISIBLE_DEVICES`` to it; it cannot be asked for a particular one. The
deployment plan aims replica ``r`` of a model at ``gpu_ids[r]`` (from
``instance_group { gpus: [...] }``), so before any framework starts, the
replica narrows ``CUDA_VISIBLE_DEVICES`` to that GPU when its node has it, and
keeps Ray's choice otherwise (a node with fewer GPUs than the ids name). Inside
the replica the GPU is then device 0, which is what frameworks are handed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"


def planned_gpu(replica_gpu_ids: Sequence[int | None], rank: int) -> int | None:
    """The GPU the plan aims replica ``rank`` at (None when the plan names none)."""
    if not replica_gpu_ids or rank < 0:
        return None
    gpu = replica_gpu_ids[rank % len(replica_gpu_ids)]
    return None if gpu is None else int(gpu)


def visible_devices(planned: int | None, node_gpus: int, assigned: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for the replica: the planned GPU where the node has it, else Ray's."""
    if planned is not None and 0 <= planned < node_gpus:
        return str(planned)
    return assigned


def replica_rank(context: Any) -> int:
    """The replica's rank among its deployment's replicas (-1 where Serve gives none)."""
    rank = getattr(context, "rank", None)
    if rank is None:
        return -1
    return int(getattr(rank, "rank", rank))


def node_gpu_count() -> int:
    """GPUs Ray counts on this replica's node."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return int(node.get("Resources", {}).get("GPU", 0))
    return 0


def pin_replica_gpu(replica_gpu_ids: Sequence[int | None], context: Any) -> str | None:
    """Narrow ``CUDA_VISIBLE_DEVICES`` to the planned GPU of this replica; returns the value in force."""
    assigned = os.environ.get(VISIBLE)
    planned = planned_gpu(replica_gpu_ids, replica_rank(context))
    if planned is None:
        return assigned
    chosen = visible_devices(planned, node_gpu_count(), assigned)
    if chosen is not None and chosen != assigned:
        os.environ[VISIBLE] = chosen
    if chosen != str(planned):
        logger.warning("replica aimed at GPU %s, which its node lacks; using GPU %s", planned, chosen)
    return chosen
