"""``triton-serve serve <repository>``: serve a model repository on a local Ray Serve instance.

The flags are the server arguments of ``serve_config.yaml`` (``args:``) under their CLI spelling;
both are read by :meth:`deployments.settings.ServerSettings.from_args`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from deployments.settings import CONTROL_MODES, ServerSettings, SettingsError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve a model repository over the KServe v2 protocol")
    p.add_argument(
        "repository", nargs="*", help="path or URL (s3://...) of a Triton model repository (one or more)"
    )
    p.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        default=[],
        help="another repository (Triton's flag; repeatable)",
    )
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument(
        "--host",
        "--http-address",
        default="127.0.0.1",
        help="address HAProxy binds, HTTP and gRPC (0.0.0.0 for every interface)",
    )
    p.add_argument("--model-control-mode", choices=CONTROL_MODES, default="none")
    p.add_argument(
        "--load-model", action="append", default=[], help="explicit mode: model to load at start ('*': all)"
    )
    p.add_argument(
        "--repository-poll-secs", type=float, default=None, help="poll mode: seconds between scans"
    )
    p.add_argument(
        "--exit-on-error", default="true", help="true: a model failing at startup fails the server (Triton's)"
    )
    p.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=None,
        help="how long a stopping model replica waits for its requests in flight (Triton's; default 30)",
    )
    p.add_argument("--id", default=None, help="the server's name in its metadata (Triton's; default triton)")
    p.add_argument(
        "--strict-model-config",
        default=None,
        metavar="BOOL",
        help="true: the same as --disable-auto-complete-config (Triton's older flag)",
    )
    p.add_argument(
        "--allow-model-file-upload",
        action="store_true",
        help="let the repository API load models from uploaded files (runs code on the cluster)",
    )
    p.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="answer these API groups only with header KEY: VALUE (repeatable)",
    )
    p.add_argument(
        "--grpc-restricted-api",
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="the same for gRPC, checked on the request metadata",
    )
    p.add_argument(
        "--log-verbose", type=int, default=None, metavar="LEVEL", help="Triton's: >0 logs verbose lines"
    )
    for level in ("info", "warning", "error"):
        p.add_argument(
            f"--log-{level}", default=None, metavar="BOOL", help=f"Triton's: log {level} lines (true)"
        )
    p.add_argument(
        "--log-format", default=None, choices=("default", "ISO8601"), help="Triton's log line format"
    )
    p.add_argument("--log-file", default=None, metavar="PATH", help="append the log there instead of stderr")
    p.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings: level=TIMESTAMPS, rate=N, count=N, mode=opentelemetry, "
        "opentelemetry,url=host:port/v1/traces, ... (repeatable)",
    )
    p.add_argument(
        "--http-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="HTTP headers whose name matches become request parameters (case-insensitive)",
    )
    p.add_argument(
        "--grpc-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="the same for gRPC metadata ('(?-i)' first: case-sensitive)",
    )
    p.add_argument("--grpc-port", type=int, default=8001, help="port of the KServe v2 gRPC service")
    p.add_argument(
        "--grpc-host",
        default="127.0.0.1",
        help="address of a gRPC server of the server replica's own (only without Serve's grpc_options; with them the gRPC port is on the HTTP host)",
    )
    p.add_argument("--allow-grpc", default="true", help="false: no gRPC service (Triton's flag)")
    p.add_argument("--grpc-infer-response-compression", default="none", help="none | gzip | deflate")
    p.add_argument(
        "--grpc-infer-response-compression-level",
        default=None,
        choices=("none", "low", "medium", "high"),
        help="Triton's: none, or gzip at any other level",
    )
    p.add_argument("--metrics-port", type=int, default=8002, help="port of Triton's /metrics")
    p.add_argument("--metrics-address", default=None, help="address /metrics binds (default: --host)")
    p.add_argument("--allow-metrics", default="true", help="false: no metrics endpoint (Triton's flag)")
    p.add_argument("--model-config-name", default=None)
    p.add_argument(
        "--model-namespacing",
        default=None,
        help="true: a model name in several repositories is a model in each (Triton's flag; default false)",
    )
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument(
        "--backend-directory",
        default=None,
        help="where a Python-based backend's <name>/model.py is found (Triton's flag; "
        "default /opt/tritonserver/backends)",
    )
    p.add_argument(
        "--strict-readiness",
        default=None,
        help="false: ready once started, whatever the models' state (Triton's flag; default true)",
    )
    p.add_argument("--no-strict-readiness", action="store_true", help="the same as --strict-readiness=false")
    p.add_argument("--access-log", action="store_true", help="log every model request (costs throughput)")
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        help="response cache, Triton's form: local,size=<bytes> (per replica process)",
    )
    p.add_argument("--response-cache-byte-size", type=int, default=None, help="older form of --cache-config")
    p.add_argument(
        "--busy-poll-us",
        type=int,
        default=None,
        help="after its last response a replica polls this long for the next request before it sleeps (0: never)",
    )
    p.add_argument(
        "--rate-limit",
        default="off",
        choices=["off", "execution_count"],
        help="execution_count: an instance runs only when the resources its instance_group's rate_limiter "
        "lists are free (docs/rate_limiter.md)",
    )
    p.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="copies of a rate-limiter resource (default: the most any loaded instance needs)",
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        help="Triton's metrics settings, <setting>=<value>: counter_latencies, summary_latencies, "
        "summary_quantiles (docs/operations.md)",
    )
    p.add_argument(
        "--model-hosts",
        type=int,
        default=0,
        help="replicas of the shared model host that serves pooled models (docs/hosts.md); 0: off",
    )
    p.add_argument("--model-host-cpus", type=float, default=None, help="CPUs of each model host replica")
    p.add_argument(
        "--model-host-memory-bytes", type=int, default=None, help="memory budget of each model host replica"
    )
    p.add_argument(
        "--model-host-gpus",
        type=int,
        default=None,
        help="whole GPUs of each model host replica; single-instance KIND_GPU models are pooled there too",
    )
    p.add_argument(
        "--model-host-gpu-memory-bytes",
        type=int,
        default=None,
        help="GPU memory budget of each GPU of a model host replica (default: 90%% of what is free)",
    )
    p.add_argument(
        "--model-host-placement",
        choices=("pooled", "dedicated"),
        default=None,
        help="where a model whose ray.placement parameter says nothing goes: pooled where it can be "
        "(default), or dedicated (only models that ask are pooled)",
    )
    p.add_argument(
        "--model-host-max-per-node",
        type=int,
        default=None,
        help="model host replicas one node may run (default: no limit)",
    )
    p.add_argument(
        "--model-host-autoscaling",
        action="append",
        default=[],
        help="Serve's autoscaling of the host replicas, <field>=<value> (max_replicas is required; "
        "min_replicas defaults to --model-hosts; target_ongoing_requests 8): docs/hosts.md",
    )
    tritonserver_flags(p)
    p.set_defaults(func=run)
    r = subparsers.add_parser(
        "ray-start",
        help="`ray start` with the request-path environment, for a cluster that `serve deploy` targets",
    )
    r.add_argument(
        "ray_args", nargs=argparse.REMAINDER, help="arguments of `ray start` (--head, --address ...)"
    )
    r.set_defaults(func=ray_start)


def server_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as the server arguments ``serve_config.yaml`` names."""
    return {
        "model_repository": [*args.repository, *args.model_repository],
        "http_host": args.host,
        "http_port": args.http_port,
        "allow_grpc": args.allow_grpc,
        "grpc_host": args.grpc_host,
        "grpc_port": args.grpc_port,
        "grpc_compression": _compression(args),
        "allow_metrics": args.allow_metrics,
        "metrics_host": args.metrics_address,
        "metrics_port": args.metrics_port,
        "model_control_mode": args.model_control_mode,
        "load_model": args.load_model,
        "repository_poll_secs": args.repository_poll_secs,
        "exit_on_error": args.exit_on_error,
        "allow_model_file_upload": args.allow_model_file_upload,
        "http_restricted_api": args.http_restricted_api,
        "grpc_restricted_api": args.grpc_restricted_api,
        "log_verbose": args.log_verbose,
        "log_info": args.log_info,
        "log_warning": args.log_warning,
        "log_error": args.log_error,
        "log_format": args.log_format,
        "log_file": args.log_file,
        "http_header_forward_pattern": args.http_header_forward_pattern,
        "grpc_header_forward_pattern": args.grpc_header_forward_pattern,
        "model_config_name": args.model_config_name,
        "backend_directory": args.backend_directory,
        "model_namespacing": args.model_namespacing,
        "disable_auto_complete_config": args.disable_auto_complete_config
        or _true(args.strict_model_config, "--strict-model-config"),
        "exit_timeout_secs": args.exit_timeout_secs,
        "server_id": args.id,
        "strict_readiness": "false" if args.no_strict_readiness else args.strict_readiness,
        "access_log": args.access_log,
        "cache_config": args.cache_config,
        "rate_limit": args.rate_limit,
        "rate_limit_resource": args.rate_limit_resource,
        "metrics_config": args.metrics_config,
        "trace_config": [
            f"{setting}{value}"
            for flag, setting in OLD_TRACE_FLAGS.items()
            for value in getattr(args, _dest(flag), [])
        ]
        + args.trace_config,
        "response_cache_byte_size": args.response_cache_byte_size,
        **({} if args.busy_poll_us is None else {"busy_poll_us": args.busy_poll_us}),
        "model_hosts": args.model_hosts,
        "model_host_cpus": args.model_host_cpus,
        "model_host_memory_bytes": args.model_host_memory_bytes,
        "model_host_gpus": args.model_host_gpus,
        "model_host_gpu_memory_bytes": args.model_host_gpu_memory_bytes,
        "model_host_placement": args.model_host_placement,
        "model_host_max_per_node": args.model_host_max_per_node,
        "model_host_autoscaling": args.model_host_autoscaling,
    }


# tritonserver flags with no effect here, and why: accepted (a Triton command line starts as it is),
# and named at start, so that none is taken as applied
NO_EFFECT: dict[str, str] = {
    "--backend-config": "backends run in the model replica's own process (no stub, no shared-memory "
    "pool to size); thread counts come from each model's config parameters",
    "--repoagent-directory": "repository agents are not run",
    "--cache-directory": "remote repositories are copied to the storage layer's folder",
    "--pinned-memory-pool-byte-size": "tensors are not staged through a pinned pool",
    "--cuda-memory-pool-byte-size": "GPU memory is the frameworks' own allocators'",
    "--cuda-virtual-address-size": "GPU memory is the frameworks' own allocators'",
    "--min-supported-compute-capability": "every GPU Ray lends a replica is used",
    "--buffer-manager-thread-count": "requests are decoded in each replica's own event loop",
    "--model-load-thread-count": "models load in their own replicas, all at once",
    "--model-load-retry-count": "a model that fails to load is not retried at start",
    "--http-thread-count": "HAProxy and each replica's event loop serve HTTP",
    "--allow-cpu-metrics": "Ray's dashboard and metrics carry the nodes' CPU and memory",
    "--allow-gpu-metrics": "Ray's dashboard and metrics carry the GPUs",
    "--metrics-interval-ms": "model metrics are counted as requests are answered",
    "--host-policy": "placement is Ray's (instance_group and ray.* parameters)",
    "--grpc-keepalive-time": "HAProxy terminates gRPC connections with its own keep-alive",
    "--grpc-keepalive-timeout": "HAProxy terminates gRPC connections with its own keep-alive",
    "--grpc-keepalive-permit-without-calls": "HAProxy terminates gRPC connections",
    "--grpc-http2-max-pings-without-data": "HAProxy terminates gRPC connections",
    "--grpc-http2-min-recv-ping-interval-without-data": "HAProxy terminates gRPC connections",
    "--grpc-http2-max-ping-strikes": "HAProxy terminates gRPC connections",
    "--reuse-http-port": "HAProxy binds the port",
    "--reuse-grpc-port": "HAProxy binds the port",
    "--grpc-address": "HAProxy serves gRPC on the --host address",
    "--grpc-max-connection-age": "HAProxy terminates gRPC connections",
    "--grpc-max-connection-age-grace": "HAProxy terminates gRPC connections",
    "--grpc-infer-allocation-pool-size": "responses are not drawn from a pool",
    "--grpc-root-cert": "TLS is terminated in front of HAProxy",
    "--grpc-server-cert": "TLS is terminated in front of HAProxy",
    "--grpc-server-key": "TLS is terminated in front of HAProxy",
    "--enable-peer-access": "GPU tensors move through DLPack and CUDA IPC",
    "--model-load-gpu-limit": "GPU memory is Ray's to place (instance_group gpus, model host budgets)",
    "--sagemaker-port": "no SageMaker endpoint",
    "--sagemaker-safe-port-range": "no SageMaker endpoint",
    "--sagemaker-thread-count": "no SageMaker endpoint",
    "--vertex-ai-port": "no Vertex AI endpoint",
    "--vertex-ai-thread-count": "no Vertex AI endpoint",
    "--vertex-ai-default-model": "no Vertex AI endpoint",
}
# tritonserver flags whose only accepted value is the one this server always has: (value, why not)
FIXED: dict[str, tuple[bool, str]] = {
    "--allow-http": (True, "HTTP carries the health, repository and model routes of every protocol"),
    "--grpc-use-ssl": (False, "terminate TLS in front of HAProxy (a load balancer or an ingress)"),
    "--grpc-use-ssl-mutual": (False, "terminate TLS in front of HAProxy (a load balancer or an ingress)"),
    "--allow-sagemaker": (False, "no SageMaker endpoint"),
    "--allow-vertex-ai": (False, "no Vertex AI endpoint"),
}
# tritonserver's older trace flags, as the --trace-config settings they are: flag -> setting prefix
OLD_TRACE_FLAGS = {
    "--trace-file": "triton,file=",
    "--trace-level": "level=",
    "--trace-rate": "rate=",
    "--trace-count": "count=",
    "--trace-log-frequency": "triton,log-frequency=",
}


def tritonserver_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's other flags (docs/compatibility.md, Server flags): each takes a value, as there."""
    group = p.add_argument_group(
        "tritonserver flags",
        "accepted so that a tritonserver command line starts as it is; "
        f"{', '.join(OLD_TRACE_FLAGS)} are --trace-config settings; those with no effect here are "
        f"named at start: {', '.join(NO_EFFECT)}; "
        + "; ".join(f"{flag} only {str(only).lower()}" for flag, (only, _) in FIXED.items()),
    )
    for flag in NO_EFFECT:
        group.add_argument(flag, action="append", default=[], metavar="VALUE", help=argparse.SUPPRESS)
    for flag in FIXED:
        group.add_argument(flag, default=None, metavar="BOOL", help=argparse.SUPPRESS)
    for flag in OLD_TRACE_FLAGS:
        group.add_argument(flag, action="append", default=[], metavar="VALUE", help=argparse.SUPPRESS)


def _true(value: str | None, flag: str) -> bool:
    """A tritonserver boolean flag's value (None: not given)."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise SettingsError(f"{flag} must be true or false, not '{value}'")


def _compression(args: argparse.Namespace) -> str:
    """The response compression: Triton's level flag (any level but none is gzip) or this server's."""
    level = args.grpc_infer_response_compression_level
    if level is None:
        return str(args.grpc_infer_response_compression)
    return "none" if level == "none" else "gzip"


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def unapplied_flags(args: argparse.Namespace) -> list[str]:
    """A line for each tritonserver flag given that has no effect here; SettingsError for one whose
    value this server cannot honour."""
    for flag, (only, why) in FIXED.items():
        value = getattr(args, _dest(flag), None)
        if value is not None and _true(value, flag) != only:
            raise SettingsError(f"{flag}={value} is not supported: {why}")
    return [
        f"{flag}={','.join(getattr(args, _dest(flag)))} has no effect here: {why}"
        for flag, why in NO_EFFECT.items()
        if getattr(args, _dest(flag), None)
    ]


def run(args: argparse.Namespace) -> int:
    from deployments.serve import launch

    try:
        unapplied = unapplied_flags(args)
        settings = ServerSettings.from_args(server_args(args))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in unapplied:
        print(f"note: {line}", file=sys.stderr, flush=True)
    stop = threading.Event()

    def on_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())

    on_signals()
    try:
        # set again once Ray is up: its failure-signal handler printed a stack trace on SIGTERM
        launch.start(settings, after_ray_init=on_signals)
        for row in launch.call_server(lambda server: server.index()):
            reason = f" ({row['reason']})" if row.get("reason") else ""
            print(
                f"{row['name']:<24} {row.get('version', '-'):>4}  {row.get('state', '-')}{reason}", flush=True
            )
        print(f"ready: serving on http://{settings.http_host}:{settings.http_port}/v2", flush=True)
        if settings.allow_grpc:
            print(f"ready: gRPC on {settings.http_host}:{settings.grpc_port}", flush=True)
        if settings.allow_metrics:
            metrics = f"http://{settings.metrics_host}:{settings.metrics_port}/metrics"
            print(f"ready: metrics on {metrics}", flush=True)
        stop.wait()
        return 0
    finally:
        print("shutting down", file=sys.stderr, flush=True)
        launch.stop()


def ray_start(args: argparse.Namespace) -> int:
    """``ray start`` with the request-path variables set, so that ``serve deploy`` to this node comes up
    on the direct request path (they are read by Ray's processes when they start)."""
    from deployments.serve import launch

    return launch.main(["ray-start", *args.ray_args])
