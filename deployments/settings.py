"""The server's settings: one typed, frozen object, read once and passed down.

Where each value comes from:

* the arguments of the server application (``args:`` in ``serve_config.yaml``; ``triton-serve serve``
  turns its flags into the same names), through :meth:`ServerSettings.from_args`;
* the process environment, read in :meth:`ServerSettings.from_args` and nowhere else
  (``TRITON_SERVE_DIRECT_ROUTES``);
* defaults below, for the tuning constants of the serving layer.

The repository stays a URL string (a local path or ``s3://...``): the loader decides how to open it.
Nothing here imports Ray.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL_MODES = ("none", "explicit", "poll")
# "0" sends every request through Serve's wrapper (Serve's request metrics, ``max_ongoing_requests``).
DIRECT_ROUTES_ENV = "TRITON_SERVE_DIRECT_ROUTES"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


class SettingsError(ValueError):
    """A server argument is missing or has a value the server cannot use."""


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server application and its model applications are configured with."""

    model_repository: str  # a local path (absolute once resolved) or a URL such as s3://bucket/models
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: tuple[str, ...] = ()  # explicit mode: loaded at start ("*" = all)
    model_config_name: str | None = None  # configs/<name>.pbtxt instead of config.pbtxt
    auto_complete: bool = True
    strict_readiness: bool = True
    access_log: bool = False  # one Serve access-log line per model request (Triton logs none)
    http_host: str = "127.0.0.1"  # the address HAProxy binds (``triton-serve serve`` only)
    http_port: int = 8000
    direct_routes: bool = True  # a model replica answers its routes without Serve's per-request wrapper
    deploy_timeout_s: float = 600.0  # how long one model's application may take to start
    stats_push_interval_s: float = 1.0  # how often replicas push statistics to the server application
    control_app_cpus: float = 0.1  # CPUs kept free for the server application at /v2

    def __post_init__(self) -> None:
        if not self.model_repository:
            raise SettingsError("model_repository is required (the path or URL of a Triton model repository)")
        if self.model_control_mode not in CONTROL_MODES:
            raise SettingsError(
                f"model_control_mode must be one of {', '.join(CONTROL_MODES)}, not '{self.model_control_mode}'"
            )
        if not 0 < self.http_port < 65536:
            raise SettingsError(f"http_port must be between 1 and 65535, not {self.http_port}")
        for name in ("deploy_timeout_s", "stats_push_interval_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        if self.control_app_cpus < 0:
            raise SettingsError(f"control_app_cpus must not be negative, not {self.control_app_cpus}")

    @classmethod
    def from_args(cls, args: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Settings from the application's ``args`` (the names of ``serve_config.yaml``) and the environment.

        Names: ``model_repository`` (required), ``model_control_mode``, ``load_model`` (a name or a
        list), ``model_config_name``, ``disable_auto_complete_config``, ``strict_readiness``,
        ``access_log``, ``http_host``, ``http_port``, ``deploy_timeout_s``, ``stats_push_interval_s``,
        ``control_app_cpus``. An unknown name is an error, so a misspelt argument is not ignored.
        """
        unknown = sorted(set(args) - _ARG_NAMES)
        if unknown:
            raise SettingsError(f"unknown server argument(s) {unknown}; known: {sorted(_ARG_NAMES)}")
        env = os.environ if environ is None else environ
        repo = args.get("model_repository")
        if not repo:
            raise SettingsError("args.model_repository is required (the path of a Triton model repository)")
        load = args.get("load_model") or ()
        values: dict[str, Any] = {
            "model_repository": resolve_repository(str(repo)),
            "model_control_mode": str(args.get("model_control_mode", "none")).lower(),
            "load_models": tuple([load] if isinstance(load, str) else (str(m) for m in load)),
            "model_config_name": args.get("model_config_name") or None,
            "auto_complete": not _flag(args, "disable_auto_complete_config", False),
            "strict_readiness": _flag(args, "strict_readiness", True),
            "access_log": _flag(args, "access_log", False),
            "direct_routes": env.get(DIRECT_ROUTES_ENV, "1").strip() != "0",
        }
        for name, kind in (
            ("http_host", str),
            ("http_port", int),
            ("deploy_timeout_s", float),
            ("stats_push_interval_s", float),
            ("control_app_cpus", float),
        ):
            if args.get(name) is not None:
                values[name] = _typed(name, args[name], kind)
        return cls(**values)

    def to_args(self) -> dict[str, Any]:
        """The application ``args`` that :meth:`from_args` reads back into these settings."""
        return {
            "model_repository": self.model_repository,
            "model_control_mode": self.model_control_mode,
            "load_model": list(self.load_models),
            "model_config_name": self.model_config_name,
            "disable_auto_complete_config": not self.auto_complete,
            "strict_readiness": self.strict_readiness,
            "access_log": self.access_log,
            "http_host": self.http_host,
            "http_port": self.http_port,
            "deploy_timeout_s": self.deploy_timeout_s,
            "stats_push_interval_s": self.stats_push_interval_s,
            "control_app_cpus": self.control_app_cpus,
        }

    def replace(self, **changes: Any) -> ServerSettings:
        return dataclasses.replace(self, **changes)


_ARG_NAMES = {
    "model_repository",
    "model_control_mode",
    "load_model",
    "model_config_name",
    "disable_auto_complete_config",
    "strict_readiness",
    "access_log",
    "http_host",
    "http_port",
    "deploy_timeout_s",
    "stats_push_interval_s",
    "control_app_cpus",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _flag(args: Mapping[str, Any], name: str, default: bool) -> bool:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, not '{value}'")


def _typed(name: str, value: Any, kind: type) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a {kind.__name__}, not '{value}'") from None


def resolve_repository(repo: str) -> str:
    """A relative repository path is taken from the working directory, else from the project root;
    URLs (``s3://...``) and absolute paths are kept as given."""
    if "://" in repo or os.path.isabs(repo):
        return repo
    here = Path.cwd() / repo
    if here.exists():
        return str(here.resolve())
    return str((PROJECT_ROOT / repo).resolve())
