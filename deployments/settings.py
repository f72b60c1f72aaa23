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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.tracing.config import TraceConfig, TraceConfigError, parse_trace_config
from repository_loader.autoscaling import Autoscaling, parse_host_autoscaling
from repository_loader.plan import DEDICATED, POOLED, HostPolicy
from repository_loader.platforms import DEFAULT_BACKEND_DIRECTORY

CONTROL_MODES = ("none", "explicit", "poll")
GRPC_COMPRESSIONS = ("none", "gzip", "deflate")
# Triton's API groups for --http-restricted-api / --grpc-restricted-api.
API_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
# "0" sends every request through Serve's wrapper (Serve's request metrics, ``max_ongoing_requests``).
DIRECT_ROUTES_ENV = "TRITON_SERVE_DIRECT_ROUTES"
# "uvicorn" serves HAProxy's connections to a replica with uvicorn's protocol instead of the server's own
REPLICA_HTTP_ENV = "TRITON_SERVE_REPLICA_HTTP"
REPLICA_HTTP_SERVERS = ("own", "uvicorn")
DELAY_SCHEDULER_ENV = "TRITONSERVER_DELAY_SCHEDULER"  # tritonserver's testing variables (Triton's qa)
BACKLOG_DELAY_SCHEDULER_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"
GRPC_RESPONSE_DELAY_ENV = "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC"
# "0" (or "false") writes log messages as the code logged them, not as JSON strings (tritonserver's variable)
ESCAPE_LOG_MESSAGES_ENV = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


class SettingsError(ValueError):
    """A server argument is missing or has a value the server cannot use."""


MIB = 1024 * 1024


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of a replica; a request over a limit is refused before the memory is
    spent, with a Triton-form JSON error (413 for sizes, 429 for concurrency, 400 otherwise).

    ``max_input_size`` is Triton's ``--http-max-input-size`` (64 MiB by default) and holds for the
    body as received; ``max_decompressed_size`` holds for a ``Content-Encoding: gzip``/``deflate``
    body while it is inflated (never after). ``max_concurrent_requests`` caps the inference requests
    one replica holds at once, on top of a model's own ``max_queue_size`` (0: no cap, as in Triton).
    ``max_url_bytes`` and ``max_header_bytes`` are checked by the application; HAProxy refuses a
    request head larger than its ``tune.bufsize`` (16 KiB) first, with its own HTML 400.
    """

    max_input_size: int = 64 * MIB
    max_decompressed_size: int = 64 * MIB
    max_tensor_elements: int = 1 << 30
    max_shape_rank: int = 32
    max_url_bytes: int = 8192
    max_header_bytes: int = 16384
    max_concurrent_requests: int = 0

    def __post_init__(self) -> None:
        for name in LIMIT_ARGS:
            value = getattr(self, name)
            if type(value) is not int or value < 0 or (value == 0 and name != "max_concurrent_requests"):
                raise SettingsError(f"{name} must be a positive integer, not {value!r}")


LIMIT_ARGS = (
    "max_input_size",
    "max_decompressed_size",
    "max_tensor_elements",
    "max_shape_rank",
    "max_url_bytes",
    "max_header_bytes",
    "max_concurrent_requests",
)


@dataclass(frozen=True)
class RestrictedApi:
    """Triton's restricted API: the groups answered only when header ``key`` carries ``value``.

    Written as Triton writes it: ``<group>[,<group>...]:<key>=<value>``.
    """

    groups: frozenset[str]
    key: str
    value: str

    @classmethod
    def parse(cls, text: str) -> RestrictedApi:
        groups, sep, rule = str(text).partition(":")
        key, eq, value = rule.partition("=")
        names = frozenset(g.strip() for g in groups.split(",") if g.strip())
        if not sep or not eq or not key.strip() or not names:
            raise SettingsError(f"a restricted API is written '<api>[,<api>...]:<key>=<value>', not '{text}'")
        unknown = sorted(names - set(API_GROUPS))
        if unknown:
            raise SettingsError(f"unknown restricted API group(s) {unknown}; known: {list(API_GROUPS)}")
        return cls(names, key.strip().lower(), value)

    def to_text(self) -> str:
        return f"{','.join(sorted(self.groups))}:{self.key}={self.value}"


def restriction_for(restricted: tuple[RestrictedApi, ...], group: str) -> RestrictedApi | None:
    """The rule guarding API ``group`` (None: it is open)."""
    return next((r for r in restricted if group in r.groups), None)


DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


@dataclass(frozen=True)
class MetricsConfig:
    """Triton's ``--metrics-config <setting>=<value>`` (repeatable): ``counter_latencies`` (the
    cumulative ``*_duration_us`` counters, on by default), ``summary_latencies`` (the ``*_summary_us``
    summaries, off by default) and ``summary_quantiles`` (``<quantile>:<error>,...``). Another setting
    is accepted and has no effect, as in tritonserver."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    ignored: tuple[str, ...] = ()

    @classmethod
    def parse(cls, texts: tuple[str, ...]) -> MetricsConfig:
        values: dict[str, Any] = {}
        ignored: list[str] = []
        for text in texts:
            setting, eq, value = text.partition("=")
            if not eq or not setting or not value or "," in setting:
                raise SettingsError(f"--metrics-config option format is <setting>=<value>. Got {text}")
            if setting in ("counter_latencies", "summary_latencies"):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise SettingsError(f"--metrics-config {setting} must be true or false, not '{value}'")
                values[setting] = value.lower() in ("true", "1")
            elif setting == "summary_quantiles":
                values[setting] = _quantiles(value)
            else:
                ignored.append(setting)
        return cls(**values, ignored=tuple(ignored))

    def to_texts(self) -> list[str]:
        quantiles = ",".join(f"{q!r}:{e!r}" for q, e in self.summary_quantiles)
        return [
            f"counter_latencies={str(self.counter_latencies).lower()}",
            f"summary_latencies={str(self.summary_latencies).lower()}",
            f"summary_quantiles={quantiles}",
            *(f"{name}=ignored" for name in self.ignored),
        ]


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _leading_number(text: str) -> float:
    """The number ``text`` starts with, as tritonserver reads one (``0.0.1`` is 0.0); -1 where none."""
    found = _NUMBER.match(text.strip())
    return float(found.group()) if found else -1.0


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    out = []
    for pair in text.split(","):
        quantile, colon, error = pair.partition(":")
        q, e = _leading_number(quantile), _leading_number(error)
        if not colon or not 0 <= q <= 1 or not 0 <= e <= 1:
            raise SettingsError(
                f"--metrics-config summary_quantiles is '<quantile>:<error>,...' with both between 0 and 1, "
                f"not '{text}'"
            )
        out.append((q, e))
    return tuple(out)


LOG_FORMATS = ("default", "ISO8601")


TRITON_LINE = "triton_line"
"""The ``extra`` key that marks a server log record tritonserver writes too at INFO (``successfully
loaded '<model>'`` and the like): it shows as the INFO flag says, where the server's other INFO lines
need verbose logging (``deployments.backends.python_api.logger``). Logged with ``extra={TRITON_LINE:
True}``."""


@dataclass(frozen=True)
class LogSettings:
    """Triton's log settings: set at start by its log flags, read and changed at run time through the
    logging extension (``GET``/``POST /v2/logging``, gRPC ``LogSettings``). Every process that logs
    applies the current value (``deployments.backends.python_api.logger.log_to_stderr``)."""

    file: str = ""  # --log-file: append there instead of standard error (not changed at run time)
    info: bool = True  # --log-info
    warning: bool = True  # --log-warning
    error: bool = True  # --log-error
    verbose_level: int = 0  # --log-verbose: >0 shows the models' verbose lines and the server's debug lines
    format: str = "default"  # --log-format: default | ISO8601
    # each message written as a JSON string, as tritonserver does unless TRITON_SERVER_ESCAPE_LOG_MESSAGES
    # is "0"; set at start only, not one of the logging extension's settings
    escape: bool = True

    def to_json(self) -> dict[str, Any]:
        """The extension's ``$log_setting_response``: every setting, under Triton's names."""
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose_level,
            "log_format": self.format,
        }

    def changed(self, **changes: Any) -> LogSettings:
        """These settings with ``changes`` (field names; values already checked by the front end)."""
        return dataclasses.replace(self, **changes)


CACHE_KINDS = ("local",)
# An idle replica pushes nothing new; it still says it is there every this many push intervals, and the
# server counts a replica's report as current for three of those (deployments/control/registry.py).
STATS_HEARTBEAT_PUSHES = 5


def cache_size(cache_config: tuple[str, ...], response_cache_byte_size: int | None) -> int | None:
    """The local response cache's size in bytes from Triton's two flags (None: no cache).

    ``cache_config`` holds ``--cache-config`` values (``local,size=1048576``);
    ``response_cache_byte_size`` is the older ``--response-cache-byte-size``. Triton's
    rules and wording: not both, one cache kind, ``<cache name>,<setting>=<value>``.
    """
    if cache_config and response_cache_byte_size is not None:
        raise SettingsError(
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
            "Please provide one or the other."
        )
    if response_cache_byte_size is not None:
        cache_config = (f"local,size={response_cache_byte_size}",)
    settings: dict[str, dict[str, str]] = {}
    for text in cache_config:
        name, comma, rest = text.partition(",")
        if not comma or not name:
            raise SettingsError(
                f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {text}"
            )
        key, eq, value = rest.partition("=")
        if not eq:
            raise SettingsError(
                f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {text}"
            )
        settings.setdefault(name, {})[key] = value
    if not settings:
        return None
    if len(settings) > 1:
        raise SettingsError(f"multiple cache configurations are not supported: {', '.join(sorted(settings))}")
    ((name, values),) = settings.items()
    if name not in CACHE_KINDS:
        raise SettingsError(f"cache '{name}' is not available in this server; the caches are: local")
    unknown = sorted(set(values) - {"size"})
    if unknown:
        raise SettingsError(f"unknown setting(s) {unknown} of the local cache; it takes size=<bytes>")
    try:
        size = int(values.get("size", ""))
    except ValueError:
        raise SettingsError(f"the local cache needs size=<bytes>, not '{values.get('size', '')}'") from None
    if size <= 0:
        raise SettingsError(f"the local cache's size must be positive, not {size}")
    return size


RATE_LIMIT_MODES = ("off", "execution_count")


@dataclass(frozen=True)
class ResourceLimit:
    """Triton's ``--rate-limit-resource=<name>:<count>[:<device>]``: the copies of a rate-limiter resource
    the server has, on every device or on ``device`` alone (a global resource: its one pool)."""

    name: str
    count: int
    device: int | None = None

    @classmethod
    def parse(cls, text: str) -> ResourceLimit:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise ValueError
            count = int(parts[1])
            device = int(parts[2]) if len(parts) == 3 else None
            if count < 0 or (device is not None and device < 0):
                raise ValueError
        except ValueError:
            raise SettingsError(
                f"rate_limit_resource '{text}' must be <name>:<count> or <name>:<count>:<device>, "
                "with a count and device that are not negative"
            ) from None
        return cls(parts[0], count, device)

    def to_text(self) -> str:
        return f"{self.name}:{self.count}" + ("" if self.device is None else f":{self.device}")


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server application and its model applications are configured with."""

    model_repository: str  # the first repository: a local path (absolute once resolved) or a URL
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: tuple[str, ...] = ()  # explicit mode: loaded at start ("*" = all)
    model_config_name: str | None = None  # configs/<name>.pbtxt instead of config.pbtxt
    auto_complete: bool = True
    # where a Python-based backend's <name>/model.py is found (Triton's --backend-directory)
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY
    strict_readiness: bool = True
    access_log: bool = False  # one Serve access-log line per model request (Triton logs none)
    http_host: str = "127.0.0.1"  # the address HAProxy binds (``triton-serve serve`` only)
    http_port: int = 8000
    allow_metrics: bool = True  # Triton's metrics endpoint (``/metrics``), served by the server application
    metrics_host: str = "127.0.0.1"  # the one address it binds (default: ``http_host``)
    metrics_port: int = 8002
    allow_grpc: bool = True  # the KServe v2 gRPC service, served by the server application's replica
    grpc_host: str = "127.0.0.1"  # without Serve's grpc_options only: the address the server replica binds (else http_host)
    grpc_port: int = 8001
    grpc_max_receive_message_bytes: int = 64 * 1024 * 1024  # a larger request: RESOURCE_EXHAUSTED
    grpc_max_send_message_bytes: int = 64 * 1024 * 1024
    grpc_compression: str = "none"  # responses: none | gzip | deflate (compressed requests always accepted)
    direct_routes: bool = True  # a model replica answers its routes without Serve's per-request wrapper
    # what serves HAProxy's connections to a replica (its local socket): "own" (deployments.protocol.
    # http1_server) or "uvicorn"; from TRITON_SERVE_REPLICA_HTTP
    replica_http: str = "own"
    # after its last response, a replica polls for the next request this long before it sleeps (0: never;
    # docs/operations.md, "Busy polling")
    busy_poll_us: int = 300
    # Triton's TRITONSERVER_DELAY_SCHEDULER and TRITONSERVER_BACKLOG_DELAY_SCHEDULER, for its qa tests:
    # each scheduler holds its first batch until this many requests are queued (and, for the sequence
    # batcher, requests of sequences wait in its backlog); 0: off. Read from the environment as tritonserver does.
    delay_scheduler: int = 0
    backlog_delay_scheduler: int = 0
    # tritonserver's TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC (testing): every gRPC answer but an
    # inference's waits this many seconds (L0_client_timeout's non-inference deadlines); 0: off
    grpc_response_delay_s: int = 0
    # log messages as JSON strings (tritonserver's TRITON_SERVER_ESCAPE_LOG_MESSAGES, read from the environment)
    log_escape: bool = True
    deploy_timeout_s: float = 600.0  # how long one model's application may take to start
    placement_timeout_s: float = 60.0  # how long its replicas may wait for a node with free resources
    stats_push_interval_s: float = 1.0  # how often replicas push statistics to the server application
    control_app_cpus: float = 0.1  # CPUs kept free for the server application at /v2
    # one idle Ray worker kept on the server replica's node for its next replica (docs/recovery.md)
    spare_worker: bool = True
    limits: RequestLimits = RequestLimits()  # per-request limits of every HTTP front end
    model_repositories: tuple[str, ...] = ()  # every repository (Triton's repeated --model-repository)
    # Triton's --model-namespacing: a name in several repositories is a model in each (docs/namespacing.md)
    model_namespacing: bool = False
    repository_poll_secs: float = 15.0  # poll mode: how often the repositories are compared
    exit_on_error: bool = True  # a model failing at startup fails the server (Triton's default)
    # Triton's --exit-timeout-secs: how long a model replica that stops (the server stopping, a model
    # unloaded, an instance removed) waits for its requests in flight before it is ended
    exit_timeout_secs: float = 30.0
    server_id: str = "triton"  # Triton's --id: the server's name in its metadata (GET /v2, ServerMetadata)
    allow_model_file_upload: bool = False  # load with ``file:<version>/<name>`` contents (runs code)
    http_restricted_api: tuple[RestrictedApi, ...] = ()
    grpc_restricted_api: tuple[RestrictedApi, ...] = ()
    # Triton's --http/--grpc-header-forward-pattern: matching headers become request parameters ("": none)
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # Triton's log flags, applied in every replica: --log-verbose (0: off), --log-info/-warning/-error,
    # --log-format (default | ISO8601), --log-file (append there instead of standard error)
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""
    # Triton's --trace-config flags (docs/operations.md, Tracing): the settings tracing starts with
    trace: TraceConfig = TraceConfig()
    response_cache_bytes: int | None = None  # the local response cache of each replica process (None: off)
    metrics_config: MetricsConfig = MetricsConfig()  # Triton's --metrics-config
    model_hosts: int = 0  # replicas of the shared model host (docs/hosts.md); 0: every model its own
    model_host_cpus: float = 0.5  # CPUs each model host replica asks Ray for
    model_host_memory_bytes: int = 4 * 1024 * MIB  # what the models of one host replica may take together
    model_host_gpus: int = 0  # whole GPUs per model host replica; >0 pools single-instance KIND_GPU models
    model_host_gpu_memory_bytes: int = 0  # what its models may take of each GPU; 0: 90% of what is free
    model_host_placement: str = POOLED  # a model that does not say: pooled where it can be, or dedicated
    model_host_max_per_node: int = 0  # model host replicas one node may run; 0: no limit
    # Serve's autoscaling of the hosts (repository_loader.autoscaling fields); None: model_hosts, fixed
    model_host_autoscaling: Autoscaling | None = None
    # Triton's --rate-limit (off | execution_count) and --rate-limit-resource (docs/rate_limiter.md)
    rate_limit: str = "off"
    rate_limit_resources: tuple[ResourceLimit, ...] = ()

    @property
    def log_settings(self) -> LogSettings:
        """The log settings the server starts with (its log flags)."""
        return LogSettings(
            file=self.log_file,
            info=self.log_info,
            warning=self.log_warning,
            error=self.log_error,
            verbose_level=self.log_verbose,
            format=self.log_format,
            escape=self.log_escape,
        )

    @property
    def host_policy(self) -> HostPolicy:
        """Whether models are pooled on model hosts, and the hosts' size (``repository_loader.plan``)."""
        return HostPolicy(
            self.model_hosts,
            self.model_host_cpus,
            self.model_host_memory_bytes,
            self.model_host_gpus,
            self.model_host_gpu_memory_bytes,
            self.model_host_placement,
            self.model_host_max_per_node,
            self.model_host_autoscaling,
        )

    @property
    def stats_heartbeat_s(self) -> float:
        """The longest a replica goes without a push (it pushes sooner when its statistics change)."""
        return STATS_HEARTBEAT_PUSHES * self.stats_push_interval_s

    def __post_init__(self) -> None:
        if not self.model_repository:
            raise SettingsError("model_repository is required (the path or URL of a Triton model repository)")
        if not self.model_repositories:
            object.__setattr__(self, "model_repositories", (self.model_repository,))
        if self.model_repositories[0] != self.model_repository:
            raise SettingsError("model_repository must be the first of model_repositories")
        if self.repository_poll_secs <= 0:
            raise SettingsError(f"repository_poll_secs must be positive, not {self.repository_poll_secs}")
        if self.model_control_mode not in CONTROL_MODES:
            raise SettingsError(
                f"model_control_mode must be one of {', '.join(CONTROL_MODES)}, not '{self.model_control_mode}'"
            )
        if not 0 < self.http_port < 65536:
            raise SettingsError(f"http_port must be between 1 and 65535, not {self.http_port}")
        if not 0 < self.metrics_port < 65536:
            raise SettingsError(f"metrics_port must be between 1 and 65535, not {self.metrics_port}")
        if not 0 < self.grpc_port < 65536:
            raise SettingsError(f"grpc_port must be between 1 and 65535, not {self.grpc_port}")
        if self.replica_http not in REPLICA_HTTP_SERVERS:
            raise SettingsError(
                f"{REPLICA_HTTP_ENV} must be one of {', '.join(REPLICA_HTTP_SERVERS)}, not '{self.replica_http}'"
            )
        if not 0 <= self.busy_poll_us <= 100_000:
            raise SettingsError(f"busy_poll_us must be between 0 and 100000, not {self.busy_poll_us}")
        if self.grpc_compression not in GRPC_COMPRESSIONS:
            raise SettingsError(
                f"grpc_compression must be one of {', '.join(GRPC_COMPRESSIONS)}, not '{self.grpc_compression}'"
            )
        for name in ("grpc_max_receive_message_bytes", "grpc_max_send_message_bytes"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("deploy_timeout_s", "stats_push_interval_s", "placement_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        if self.exit_timeout_secs < 0:
            raise SettingsError(f"exit_timeout_secs must not be negative, not {self.exit_timeout_secs}")
        if not self.server_id:
            raise SettingsError("server_id must not be empty")
        if self.control_app_cpus < 0:
            raise SettingsError(f"control_app_cpus must not be negative, not {self.control_app_cpus}")
        if self.model_host_placement not in (POOLED, DEDICATED):
            raise SettingsError(
                f"model_host_placement must be {POOLED} or {DEDICATED}, not '{self.model_host_placement}'"
            )
        for name in (
            "model_hosts",
            "model_host_gpus",
            "model_host_gpu_memory_bytes",
            "model_host_max_per_node",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must not be negative, not {getattr(self, name)}")
        for name in ("model_host_cpus", "model_host_memory_bytes"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, not {getattr(self, name)}")
        if self.rate_limit not in RATE_LIMIT_MODES:
            raise SettingsError(
                f"rate_limit must be one of {', '.join(RATE_LIMIT_MODES)}, not '{self.rate_limit}'"
            )

    @classmethod
    def from_args(cls, args: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Settings from the application's ``args`` (the names of ``serve_config.yaml``) and the environment.

        Names: ``model_repository`` (required), ``model_control_mode``, ``load_model`` (a name or a
        list), ``model_config_name``, ``disable_auto_complete_config``, ``backend_directory``, ``strict_readiness``,
        ``access_log``, ``http_host``, ``http_port``, ``allow_grpc``, ``grpc_host``, ``grpc_port``,
        ``grpc_max_receive_message_bytes``, ``grpc_max_send_message_bytes``, ``grpc_compression``,
        ``deploy_timeout_s``, ``stats_push_interval_s``, ``exit_timeout_secs``, ``server_id``,
        ``control_app_cpus``, ``busy_poll_us``, ``model_hosts``, ``model_host_cpus``, ``model_host_memory_bytes``, ``model_host_gpus``,
        ``model_host_gpu_memory_bytes``, ``model_host_placement``, ``model_host_max_per_node``, ``model_host_autoscaling`` (a mapping, or
        ``field=value`` texts), ``rate_limit``, ``rate_limit_resource`` (a text or a list), and the :class:`RequestLimits` by their field names (``max_input_size``,
        ...). An unknown name is an error, so a misspelt argument is not ignored.
        """
        unknown = sorted(set(args) - _ARG_NAMES)
        if unknown:
            raise SettingsError(f"unknown server argument(s) {unknown}; known: {sorted(_ARG_NAMES)}")
        env = os.environ if environ is None else environ
        repo = args.get("model_repository")
        if not repo:
            raise SettingsError("args.model_repository is required (the path of a Triton model repository)")
        # a repository named twice is one repository, as Triton keeps a set of them
        repos = tuple(dict.fromkeys(resolve_repository(r) for r in _texts(repo)))
        values: dict[str, Any] = {
            "model_repository": repos[0],
            "model_repositories": repos,
            "model_namespacing": _flag(args, "model_namespacing", False),
            "model_control_mode": str(args.get("model_control_mode", "none")).lower(),
            "load_models": _texts(args.get("load_model")),
            "model_config_name": args.get("model_config_name") or None,
            "auto_complete": not _flag(args, "disable_auto_complete_config", False),
            "backend_directory": str(args.get("backend_directory") or DEFAULT_BACKEND_DIRECTORY),
            "strict_readiness": _flag(args, "strict_readiness", True),
            "exit_on_error": _flag(args, "exit_on_error", True),
            "allow_model_file_upload": _flag(args, "allow_model_file_upload", False),
            "http_restricted_api": parse_restricted(args.get("http_restricted_api")),
            "grpc_restricted_api": parse_restricted(args.get("grpc_restricted_api")),
            "log_info": _flag(args, "log_info", True),
            "log_warning": _flag(args, "log_warning", True),
            "log_error": _flag(args, "log_error", True),
            "log_format": _log_format(args.get("log_format")),
            "log_file": str(args.get("log_file") or ""),
            "http_header_forward_pattern": _pattern(args, "http_header_forward_pattern"),
            "grpc_header_forward_pattern": _pattern(args, "grpc_header_forward_pattern"),
            "access_log": _flag(args, "access_log", False),
            "allow_metrics": _flag(args, "allow_metrics", True),
            "metrics_host": str(args.get("metrics_host") or args.get("http_host") or "127.0.0.1"),
            "allow_grpc": _flag(args, "allow_grpc", True),
            "spare_worker": _flag(args, "spare_worker", True),
            "direct_routes": env.get(DIRECT_ROUTES_ENV, "1").strip() != "0",
            "replica_http": env.get(REPLICA_HTTP_ENV, "own").strip().lower() or "own",
            "busy_poll_us": _typed("busy_poll_us", args.get("busy_poll_us", 300), int),
            "delay_scheduler": _typed(DELAY_SCHEDULER_ENV, env.get(DELAY_SCHEDULER_ENV) or "0", int),
            "log_escape": env.get(ESCAPE_LOG_MESSAGES_ENV, "1").strip().lower() not in ("0", "false"),
            "backlog_delay_scheduler": _typed(
                BACKLOG_DELAY_SCHEDULER_ENV, env.get(BACKLOG_DELAY_SCHEDULER_ENV) or "0", int
            ),
            "grpc_response_delay_s": _typed(
                GRPC_RESPONSE_DELAY_ENV, env.get(GRPC_RESPONSE_DELAY_ENV) or "0", int
            ),
            "metrics_config": MetricsConfig.parse(_texts(args.get("metrics_config"))),
            "rate_limit": str(args.get("rate_limit") or "off").lower(),
            "rate_limit_resources": tuple(
                ResourceLimit.parse(t) for t in _texts(args.get("rate_limit_resource"))
            ),
            "trace": _trace_config(args.get("trace_config")),
            "response_cache_bytes": cache_size(
                _texts(args.get("cache_config")),
                None
                if args.get("response_cache_byte_size") is None
                else _typed("response_cache_byte_size", args["response_cache_byte_size"], int),
            ),
        }
        for name, kind in (
            ("repository_poll_secs", float),
            ("exit_timeout_secs", float),
            ("server_id", str),
            ("log_verbose", int),
            ("http_host", str),
            ("http_port", int),
            ("metrics_port", int),
            ("grpc_host", str),
            ("grpc_port", int),
            ("grpc_max_receive_message_bytes", int),
            ("grpc_max_send_message_bytes", int),
            ("grpc_compression", str),
            ("deploy_timeout_s", float),
            ("placement_timeout_s", float),
            ("stats_push_interval_s", float),
            ("control_app_cpus", float),
            ("model_hosts", int),
            ("model_host_cpus", float),
            ("model_host_memory_bytes", int),
            ("model_host_gpus", int),
            ("model_host_gpu_memory_bytes", int),
            ("model_host_placement", str),
            ("model_host_max_per_node", int),
        ):
            if args.get(name) is not None:
                values[name] = _typed(name, args[name], kind)
        if args.get("model_host_autoscaling"):
            values["model_host_autoscaling"] = _host_autoscaling(
                args["model_host_autoscaling"], int(values.get("model_hosts", 0))
            )
        limits = {n: _typed(n, args[n], int) for n in LIMIT_ARGS if args.get(n) is not None}
        if limits:
            values["limits"] = RequestLimits(**limits)
        return cls(**values)

    def to_args(self) -> dict[str, Any]:
        """The application ``args`` that :meth:`from_args` reads back into these settings."""
        return {
            "model_repository": list(self.model_repositories),
            "model_namespacing": self.model_namespacing,
            "model_control_mode": self.model_control_mode,
            "load_model": list(self.load_models),
            "repository_poll_secs": self.repository_poll_secs,
            "model_config_name": self.model_config_name,
            "disable_auto_complete_config": not self.auto_complete,
            "backend_directory": self.backend_directory,
            "strict_readiness": self.strict_readiness,
            "exit_on_error": self.exit_on_error,
            "exit_timeout_secs": self.exit_timeout_secs,
            "busy_poll_us": self.busy_poll_us,
            "server_id": self.server_id,
            "allow_model_file_upload": self.allow_model_file_upload,
            "http_restricted_api": [r.to_text() for r in self.http_restricted_api],
            "grpc_restricted_api": [r.to_text() for r in self.grpc_restricted_api],
            "log_verbose": self.log_verbose,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_format": self.log_format,
            "log_file": self.log_file,
            "http_header_forward_pattern": self.http_header_forward_pattern,
            "grpc_header_forward_pattern": self.grpc_header_forward_pattern,
            "access_log": self.access_log,
            "http_host": self.http_host,
            "http_port": self.http_port,
            "allow_metrics": self.allow_metrics,
            "metrics_host": self.metrics_host,
            "metrics_port": self.metrics_port,
            "allow_grpc": self.allow_grpc,
            "grpc_host": self.grpc_host,
            "grpc_port": self.grpc_port,
            "grpc_max_receive_message_bytes": self.grpc_max_receive_message_bytes,
            "grpc_max_send_message_bytes": self.grpc_max_send_message_bytes,
            "grpc_compression": self.grpc_compression,
            "deploy_timeout_s": self.deploy_timeout_s,
            "placement_timeout_s": self.placement_timeout_s,
            "stats_push_interval_s": self.stats_push_interval_s,
            "control_app_cpus": self.control_app_cpus,
            "spare_worker": self.spare_worker,
            "model_hosts": self.model_hosts,
            "model_host_cpus": self.model_host_cpus,
            "model_host_memory_bytes": self.model_host_memory_bytes,
            "model_host_gpus": self.model_host_gpus,
            "model_host_gpu_memory_bytes": self.model_host_gpu_memory_bytes,
            "model_host_placement": self.model_host_placement,
            "model_host_max_per_node": self.model_host_max_per_node,
            "model_host_autoscaling": (
                None if self.model_host_autoscaling is None else self.model_host_autoscaling.serve_config()
            ),
            "metrics_config": self.metrics_config.to_texts(),
            "rate_limit": self.rate_limit,
            "rate_limit_resource": [r.to_text() for r in self.rate_limit_resources],
            "trace_config": list(self.trace.flags),
            "cache_config": []
            if self.response_cache_bytes is None
            else [f"local,size={self.response_cache_bytes}"],
            **{name: getattr(self.limits, name) for name in LIMIT_ARGS},
        }

    def replace(self, **changes: Any) -> ServerSettings:
        return dataclasses.replace(self, **changes)


_ARG_NAMES = {
    "model_repository",
    "model_namespacing",
    "model_control_mode",
    "load_model",
    "repository_poll_secs",
    "model_config_name",
    "disable_auto_complete_config",
    "backend_directory",
    "strict_readiness",
    "exit_on_error",
    "exit_timeout_secs",
    "busy_poll_us",
    "server_id",
    "allow_model_file_upload",
    "http_restricted_api",
    "grpc_restricted_api",
    "http_header_forward_pattern",
    "grpc_header_forward_pattern",
    "log_verbose",
    "log_info",
    "log_warning",
    "log_error",
    "log_format",
    "log_file",
    "access_log",
    "http_host",
    "http_port",
    "allow_metrics",
    "metrics_host",
    "metrics_port",
    "allow_grpc",
    "grpc_host",
    "grpc_port",
    "grpc_max_receive_message_bytes",
    "grpc_max_send_message_bytes",
    "grpc_compression",
    "deploy_timeout_s",
    "placement_timeout_s",
    "stats_push_interval_s",
    "control_app_cpus",
    "spare_worker",
    "model_hosts",
    "model_host_cpus",
    "model_host_memory_bytes",
    "model_host_gpus",
    "model_host_gpu_memory_bytes",
    "model_host_placement",
    "model_host_max_per_node",
    "model_host_autoscaling",
    "rate_limit",
    "rate_limit_resource",
    "cache_config",
    "metrics_config",
    "response_cache_byte_size",
    "trace_config",
    *LIMIT_ARGS,
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _host_autoscaling(value: Any, model_hosts: int) -> Autoscaling:
    """``model_host_autoscaling``: a mapping (``serve_config.yaml``) or ``field=value`` texts (the CLI)."""
    if model_hosts <= 0:
        raise SettingsError("model_host_autoscaling needs model_hosts above 0 (the hosts' start count)")
    if isinstance(value, Mapping):
        fields = dict(value)
    else:
        fields = {}
        for text in _texts(value):
            key, sep, raw = text.partition("=")
            if not sep:
                raise SettingsError(f"model_host_autoscaling takes field=value, not '{text}'")
            fields[key.strip()] = raw.strip()
    try:
        return parse_host_autoscaling(fields, model_hosts)
    except ValueError as exc:
        raise SettingsError(f"model_host_autoscaling: {exc}") from None


def _texts(value: Any) -> tuple[str, ...]:
    """A name or a list of names (``serve_config.yaml`` takes either) as a tuple."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def parse_restricted(value: Any) -> tuple[RestrictedApi, ...]:
    return tuple(RestrictedApi.parse(t) for t in _texts(value))


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


def _pattern(args: Mapping[str, Any], name: str) -> str:
    """A header forward pattern, checked that it compiles (a bad one fails the start, named)."""
    text = str(args.get(name) or "")
    try:
        compile_header_pattern(text)
    except re.error as e:
        raise SettingsError(f"args.{name}: invalid header forward pattern '{text}': {e}") from None
    return text


_CASE_SENSITIVE = "(?-i)"


def compile_header_pattern(text: str) -> re.Pattern[str] | None:
    """The pattern of Triton's ``--http/--grpc-header-forward-pattern`` (None: forward nothing). It
    ignores case unless it starts with ``(?-i)``, as Triton's flag reads; raises :class:`re.error`."""
    if not text:
        return None
    if text.startswith(_CASE_SENSITIVE):
        return re.compile(text[len(_CASE_SENSITIVE) :])
    return re.compile(text, re.IGNORECASE)


def _trace_config(value: Any) -> TraceConfig:
    """Triton's repeated ``--trace-config`` (``mode=opentelemetry``, ``opentelemetry,url=...``, ...)."""
    try:
        return parse_trace_config(_texts(value))
    except TraceConfigError as exc:
        raise SettingsError(str(exc)) from None


def _log_format(value: Any) -> str:
    """Triton's ``--log-format``: ``default`` or ``ISO8601``."""
    text = str(value or "default")
    if text not in LOG_FORMATS:
        raise SettingsError(f"log_format must be 'default' or 'ISO8601', not '{text}'")
    return text
