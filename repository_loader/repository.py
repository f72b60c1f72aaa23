"""Reading a Triton model repository: models, versions, configs, and their descriptions.

``<repo>/<model>/config.pbtxt`` plus numeric version folders. Each model is read,
auto-completed, validated and described on its own: a broken model is reported
(UNAVAILABLE, with every error found) and never stops the others. Ensembles are
checked against the models their steps name, which are loaded first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from repository_loader import platforms
from repository_loader.autocomplete import (
    complete,
    detect_backend,
    normalize_instance_groups,
    normalize_platform,
)
from repository_loader.config import config_path_candidates, parse_config
from repository_loader.describe import describe
from repository_loader.ensemble_rules import check_ensemble, ensemble_cycle, with_step_labels
from repository_loader.errors import ConfigError, ConfigUnread, NotFound, ServerError
from repository_loader.findings import Findings, ModelFiles
from repository_loader.model import ModelDescription, ModelState
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.storage import Storage, open_storage
from repository_loader.validation import validate_config
from repository_loader.versions import list_versions, select_versions

log = logging.getLogger("repository_loader")
log.addHandler(logging.NullHandler())


class ModelLoadError(ConfigError):
    """A model could not be loaded; ``errors`` lists every problem found."""

    def __init__(self, model: str, errors: Sequence[str], *, config_unread: bool = False) -> None:
        super().__init__("\n".join(errors) or f"model '{model}' failed to load")
        self.model = model
        self.errors = list(errors)
        self.config_unread = config_unread  # its configuration could not be read (ConfigUnread)


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index (Triton's ``POST /v2/repository/index``)."""

    name: str
    version: str
    state: str
    reason: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "state": self.state, "reason": self.reason}


@dataclass
class RepositoryState:
    """What loading a repository produced: ready models, failed ones, and warnings."""

    root: str
    models: dict[str, ModelDescription] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    unread: set[str] = field(default_factory=set)  # failed: their configuration could not be read
    warnings: list[str] = field(default_factory=list)

    @property
    def index(self) -> list[IndexEntry]:
        """Every model version, ready or not, sorted by name."""
        rows: list[IndexEntry] = []
        for name in sorted({*self.models, *self.failed}):
            if name in self.models:
                ready = ModelState.READY.value
                rows.extend(IndexEntry(name, str(v), ready) for v in self.models[name].versions)
            else:
                reason = "; ".join(self.failed[name])
                rows.append(IndexEntry(name, "", ModelState.UNAVAILABLE.value, reason))
        return rows

    @property
    def ok(self) -> bool:
        return not self.failed


def load_repository(
    path: str | Path,
    *,
    config_name: str | None = None,
    auto_complete: bool = True,
    cache_dir: str | Path | None = None,
    backend_directory: str | Path | None = platforms.DEFAULT_BACKEND_DIRECTORY,
) -> RepositoryState:
    """Load every model of the repository at ``path``: a folder or a URL as Triton writes it
    (``s3://bucket/path``, ``s3://host:port/bucket/path``, ``gs://bucket/path``,
    ``as://account/container/path``; see :mod:`repository_loader.storage`).

    A remote model's selected versions are copied under ``cache_dir`` (default: the storage
    layer's), so every description's ``path`` is local. Raises :class:`NotFound` when the
    repository itself is missing; problems of a model land in ``RepositoryState.failed``. A model whose
    ``backend`` is none of this server's runs on the Python backend where ``backend_directory`` holds
    ``<backend>/model.py`` (Triton's Python-based backends).
    """
    loader = _Loader(
        *open_storage(path, cache_dir),
        config_name=config_name,
        auto_complete=auto_complete,
        backend_directory=backend_directory,
    )
    for name in loader.model_names():
        loader.load(name)
    return loader.state


def load_model(
    repository: str | Path,
    name: str,
    *,
    config_name: str | None = None,
    auto_complete: bool = True,
    cache_dir: str | Path | None = None,
    elsewhere: Callable[[str, str], ModelDescription | None] | None = None,
    backend_directory: str | Path | None = platforms.DEFAULT_BACKEND_DIRECTORY,
) -> ModelDescription:
    """Load one model (and, for an ensemble, the models its steps name) of a repository
    given as :func:`load_repository` takes it. ``elsewhere`` describes a step model (its name, and
    the step's ``model_namespace``) that is in another repository of the server (None where it is
    in this one or in none), as Triton's ensembles may name one.

    Raises :class:`NotFound` for an unknown model and :class:`ModelLoadError`
    listing every problem of a broken one.
    """
    loader = _Loader(
        *open_storage(repository, cache_dir),
        config_name=config_name,
        auto_complete=auto_complete,
        backend_directory=backend_directory,
    )
    loader.elsewhere = elsewhere
    if name not in loader.model_names():
        raise NotFound(f"model '{name}' is not in the repository '{repository}'")
    loader.load(name)
    if name in loader.state.failed:
        raise ModelLoadError(name, loader.state.failed[name], config_unread=name in loader.state.unread)
    return loader.state.models[name]


@dataclass
class _Prepared:
    """A model read, completed and checked on its own (before cross-model checks)."""

    config: pb.ModelConfig
    findings: Findings
    path: Path
    versions: list[int]
    python_runtime: Path | None = None  # a Python-based backend's model.py


class _Loader:
    """Loads models of one repository, each once, remembering results."""

    def __init__(
        self,
        storage: Storage,
        root: str,
        *,
        config_name: str | None,
        auto_complete: bool,
        backend_directory: str | Path | None = platforms.DEFAULT_BACKEND_DIRECTORY,
    ) -> None:
        self.storage = storage
        self.backend_directory = backend_directory
        self.root = root
        self.config_name = config_name
        self.auto_complete = auto_complete
        self.state = RepositoryState(root=root)
        self._names: list[str] | None = None
        self._prepare_cache: dict[str, _Prepared | ServerError] = {}
        # steps of other repositories: (name, model_namespace) -> description
        self.elsewhere: Callable[[str, str], ModelDescription | None] | None = None

    def model_names(self) -> list[str]:
        if self._names is None:
            names = []
            for entry in self.storage.list_dir(self.root):
                if not self.storage.is_dir(self.storage.join(self.root, entry)):
                    continue
                if entry.startswith("."):
                    self._warn(f"ignoring hidden folder '{entry}' in the repository")
                    continue
                names.append(entry)
            self._names = names
        return self._names

    def _warn(self, message: str) -> None:
        log.warning(message)
        self.state.warnings.append(message)

    def load(self, name: str) -> None:
        if name in self.state.models or name in self.state.failed:
            return
        prepared = self._prepared(name)
        if isinstance(prepared, ServerError):
            self.state.failed[name] = [_with_model(name, prepared.message)]
            if isinstance(prepared, ConfigUnread):
                self.state.unread.add(name)
            return
        for warning in prepared.findings.warnings:  # fields accepted but not acted on
            self._warn(warning)
        description = None
        if not prepared.findings:
            description = describe(prepared.config, prepared.path, prepared.versions, prepared.python_runtime)
            if description.is_ensemble:
                self._check_ensemble(description, prepared.findings)
                if not prepared.findings and self._has_decoupled_step(description):
                    # Triton makes an ensemble with a decoupled step (at any depth) decoupled itself
                    prepared.config.model_transaction_policy.decoupled = True
                    description = describe(
                        prepared.config, prepared.path, prepared.versions, prepared.python_runtime
                    )
        if prepared.findings or description is None:
            self.state.failed[name] = prepared.findings.errors
            return
        if description.is_ensemble:
            description = with_step_labels(description, self.state.models)
        self.state.models[name] = description

    def _check_ensemble(self, ensemble: ModelDescription, findings: Findings) -> None:
        """Load the models the steps name (unless the ensembles depend on each other), then check the ensemble."""
        if not ensemble_cycle(ensemble.name, self._step_models):
            for step in ensemble.ensemble_steps:
                name, here = step.model_name, step.model_name in self.model_names()
                member = None
                if (
                    self.elsewhere is not None
                    and name not in self.state.models
                    and (step.model_namespace or not here)
                ):
                    member = self.elsewhere(name, step.model_namespace)
                    if member is not None:
                        self.state.models[name] = member
                if member is None and here:
                    self.load(name)
        check_ensemble(
            ensemble, self.state.models, findings, failed=self.state.failed, step_models=self._step_models
        )

    def _has_decoupled_step(self, ensemble: ModelDescription) -> bool:
        """Whether a step of ``ensemble`` is decoupled (a nested ensemble is, where one of its steps is)."""
        steps = (self.state.models.get(step.model_name) for step in ensemble.ensemble_steps)
        return any(step is not None and step.decoupled for step in steps)

    def _step_models(self, name: str) -> list[str]:
        """The models the steps of ``name`` name ([] for a model that is not an ensemble of the repository)."""
        prepared = self._prepared(name) if name in self.model_names() else None
        if not isinstance(prepared, _Prepared) or prepared.config.platform != platforms.ENSEMBLE:
            return []
        return [step.model_name for step in prepared.config.ensemble_scheduling.step]

    def _prepared(self, name: str) -> _Prepared | ServerError:
        """``name`` read, completed and checked on its own, once."""
        if name not in self._prepare_cache:
            try:
                self._prepare_cache[name] = self._prepare(name)
            except ServerError as exc:
                self._prepare_cache[name] = exc
        return self._prepare_cache[name]

    # --- one model ----------------------------------------------------------

    def _prepare(self, name: str) -> _Prepared:
        model_dir = self.storage.join(self.root, name)
        config, source, has_file = self._read_config(name, model_dir)
        if not has_file and not self.auto_complete:
            raise ConfigUnread(f"{source}: no config file, and auto-complete is disabled")
        findings = Findings(name, source)
        if config.name and config.name != name:
            findings.add("name", f"'{config.name}' does not match the model folder '{name}'")
        config.name = name
        available = list_versions(self.storage, model_dir, name, self._warn)
        versions = select_versions(config.version_policy, available, findings)
        unselected = {str(v) for v in available if v not in versions}
        local_dir = self.storage.localize(model_dir, exclude=unselected)
        normalize_platform(config)
        runtime = self._python_runtime(config, findings)
        if self.auto_complete:
            latest = local_dir / str(versions[-1]) if versions else None
            detect_backend(
                config, sorted(p.name for p in latest.iterdir()) if latest and latest.is_dir() else []
            )
            if versions and not findings:
                config = complete(
                    config,
                    lambda: runtime or self._model_file(config, local_dir, versions[-1]),
                    has_config_file=has_file,
                    version_dir=local_dir / str(versions[-1]),
                )
        normalize_instance_groups(config)
        files = ModelFiles(exists=lambda rel: (local_dir / rel).exists())
        validate_config(config, findings, files)
        self._check_outputs_listed(config, findings)
        if config.platform != platforms.ENSEMBLE and runtime is None and not findings:
            self._check_model_files(config, local_dir, versions, findings)
        if not available:
            findings.add("versions", "no version folder found (expected numeric folders such as '1')")
        return _Prepared(config, findings, local_dir, versions, runtime)

    def _python_runtime(self, config: pb.ModelConfig, findings: Findings) -> Path | None:
        """A Python-based backend's ``model.py`` for ``config`` (its ``runtime`` filled in as Triton fills
        it); a ``.py`` runtime the backend directory does not hold is an error."""
        runtime = platforms.python_based_runtime(config, self.backend_directory)
        if runtime is not None:
            config.runtime = config.runtime or platforms.PYTHON_BASED_RUNTIME
        elif config.runtime.endswith(".py") and config.backend not in platforms.SUPPORTED_BACKENDS:
            findings.add(
                "runtime",
                f"Python-based backend '{config.backend}': no '{config.runtime}' in "
                f"'{self.backend_directory}/{config.backend}'",
            )
        return runtime

    def _read_config(self, name: str, model_dir: str) -> tuple[pb.ModelConfig, str, bool]:
        for candidate in config_path_candidates(model_dir, self.config_name, self.storage.join):
            if self.storage.is_file(candidate):
                source = _relative(candidate, self.root)
                raw = self.storage.read_bytes(candidate)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigUnread(
                        f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                    ) from None
                try:
                    return parse_config(text, source), source, True
                except ConfigError as exc:
                    raise ConfigUnread(exc.message) from None
        return pb.ModelConfig(), f"{name}/config.pbtxt (absent)", False

    @staticmethod
    def _model_file(config: pb.ModelConfig, local_dir: Path, version: int) -> Path:
        backend = platforms.effective_backend(config)
        filename = config.default_model_filename or platforms.default_model_filename(backend)
        return local_dir / str(version) / filename

    def _check_model_files(
        self, config: pb.ModelConfig, local_dir: Path, versions: list[int], findings: Findings
    ) -> None:
        for version in versions:
            path = self._model_file(config, local_dir, version)
            per_gpu = [local_dir / str(version) / name for name in config.cc_model_filenames.values()]
            if any(p.exists() for p in per_gpu):
                continue  # a GPU instance loads the one for its compute capability (Triton's cc_model_filenames)
            if path.name and not path.exists():
                where = "default_model_filename" if config.default_model_filename else "versions"
                findings.add(
                    where,
                    f"version {version}: model file '{path.name}' not found in '{config.name}/{version}'",
                )

    @staticmethod
    def _check_outputs_listed(config: pb.ModelConfig, findings: Findings) -> None:
        backend = platforms.effective_backend(config)
        if backend in ("onnxruntime", "pytorch", "tensorrt") and not config.output:
            hint = " (or let auto-complete read them from the model file)" if backend == "onnxruntime" else ""
            findings.add("output", f"the model lists no outputs: list them in the config{hint}")


def _relative(path: str, root: str) -> str:
    return path[len(root) :].lstrip("/\\") if path.startswith(root) else path


def _with_model(name: str, message: str) -> str:
    return (
        message if f"'{name}'" in message or message.startswith(f"{name}/") else f"model '{name}': {message}"
    )
