"""Ensembles: the validated step graph, its scheduler, step placement and tensor hand-off.

Framework-free: the serving layer provides a ``ModelExecutor`` that reaches the
composing models (deployment handles, or backends loaded in the same replica).
"""

from ensembles.graph import EnsembleGraph, StepNode, build_graph
from ensembles.handoff import Route
from ensembles.placement import EnsemblePlacement, choose_placement, describe_placement
from ensembles.scheduler import EnsembleScheduler, StepTiming

__all__ = [
    "EnsembleGraph",
    "EnsemblePlacement",
    "EnsembleScheduler",
    "Route",
    "StepNode",
    "StepTiming",
    "build_graph",
    "choose_placement",
    "describe_placement",
]
