"""Ensembles: the validated step graph, its scheduler, step placement and tensor hand-off.

Framework-free: the serving layer provides a ``ModelExecutor`` that reaches the
composing models (deployment handles, or backends loaded in the same replica).

Importing the package registers the ensemble backend (platform ``ensemble``) with
``deployments.backends.registry``; its module, which runs hosted models through the
runtime, is imported only when an ensemble loads.
"""

from deployments.backends.base import Backend
from deployments.backends.registry import register_backend
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
    "register",
]


def _ensemble_backend() -> type[Backend]:
    from ensembles.backend import EnsembleBackend

    return EnsembleBackend


def register() -> None:
    """Make the ensemble backend (platform ``ensemble``) known to ``deployments.backends.registry``;
    done on import, and called by a process that must be sure of it (a model replica, whose class
    may arrive pickled by value, without its module's imports)."""
    register_backend("ensemble", _ensemble_backend, platforms=("ensemble",))


register()
