"""Reads Triton model repositories into typed model descriptions and a deployment plan.

Public entry points (imported lazily, so ``repository_loader.errors`` stays light):
``load_repository``, ``load_model``, ``RepositoryState``, ``ModelLoadError``,
``plan_deployments``, ``ClusterResources``, ``DeploymentPlan``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_repository": "repository_loader.repository",
    "load_model": "repository_loader.repository",
    "RepositoryState": "repository_loader.repository",
    "ModelLoadError": "repository_loader.repository",
    "plan_deployments": "repository_loader.plan",
    "ClusterResources": "repository_loader.plan",
    "DeploymentPlan": "repository_loader.plan",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'repository_loader' has no attribute {name!r}")
