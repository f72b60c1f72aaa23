"""The Grafana dashboards of ``deploy/grafana`` query only the families and labels the server exports:
Triton's ``/metrics`` as ``render_triton`` prints it, and the replicas'
counters as Ray's Prometheus export names them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployments.runtime.metrics import FAMILIES, TritonMetrics, render_triton
from deployments.serve.ray_metrics import RayGauges

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# labels Prometheus adds to every scraped series
TARGET_LABELS = frozenset({"instance", "job"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_MODIFIERS = ("by", "without", "on", "ignoring", "group_left", "group_right")
_KEYWORDS = frozenset(("and", "or", "unless", "bool", "offset", "inf", "nan", *_MODIFIERS))
_GROUPING = re.compile(rf"\b(?:{'|'.join(_MODIFIERS)})\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)")


@dataclass
class Query:
    """What one PromQL expression reads: metric names, the labels matched on each, the labels grouped by."""

    names: set[str] = field(default_factory=set)
    matched: dict[str, set[str]] = field(default_factory=dict)
    grouped: set[str] = field(default_factory=set)


def parse(expr: str) -> Query:
    """The metric names and labels of ``expr`` (strings, Grafana variables and ranges aside)."""
    if "__name__" in expr:
        raise ValueError(f"a metric selected by __name__ cannot be checked: {expr}")
    text = _VARIABLE.sub(" ", _STRING.sub('""', expr))
    query = Query()
    for selector in _SELECTOR.finditer(text):
        labels = set(_MATCHER.findall(selector.group(2)))
        if selector.group(1):
            query.matched.setdefault(selector.group(1), set()).update(labels)
    for grouping in _GROUPING.finditer(text):
        query.grouped.update(label.strip() for label in grouping.group(1).split(",") if label.strip())
    text = _RANGE.sub(" ", _GROUPING.sub(" ", _SELECTOR.sub(r" \1 ", text)))
    for word in _IDENTIFIER.finditer(text):
        if word.group() not in _KEYWORDS and not text[word.end() :].lstrip().startswith("("):
            query.names.add(word.group())
    return query


def unknown(names: Iterable[str], families: Iterable[str], histograms: Iterable[str] = ()) -> set[str]:
    """The names that are neither a family nor a histogram's ``_bucket``, ``_sum`` or ``_count`` series."""
    known = set(families) | {h + suffix for h in histograms for suffix in HISTOGRAM_SUFFIXES}
    return set(names) - known


@dataclass
class Exported:
    """The families one export prints, their label names, and which are histograms."""

    labels: dict[str, set[str]]
    histograms: set[str]


def triton_export() -> Exported:
    """Every family of ``/metrics`` with its labels, read from the text the server renders for one model
    that uses the response cache, the host gauges and one model host."""
    stats = {"version": "1", "inference_count": 4, "execution_count": 2, "inference_stats": {}}
    model = {"stats": [stats], "pending": {"1": 1}, "failures": {}, "response_cache": True}
    system = {"nv_cpu_utilization": 0.5, "nv_cpu_memory_total_bytes": 2.0, "nv_cpu_memory_used_bytes": 1.0}
    host = {"counters": {"m": {"loads": 1}}, "resident": {"m": 10}, "resident_gpu": {"m": 0}}
    text = render_triton({"m": model}, None, system, hosts=[host])
    kinds = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    labels: dict[str, set[str]] = {name: set() for name in kinds}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            family = name.split()[0]
            family = next((h for h in kinds if family in (h + s for s in HISTOGRAM_SUFFIXES)), family)
            labels[family].update(_MATCHER.findall(rest.rpartition("}")[0]))
    return Exported(labels, {name for name, kind in kinds.items() if kind in ("histogram", "summary")})


def ray_export() -> Exported:
    """The counters a replica hands to Ray, named as Ray's Prometheus export prints them: Ray prefixes
    ``ray_`` and, for a counter, the exposition format adds ``_total``."""
    made: dict[str, tuple[str, ...]] = {}

    class Recorder:
        def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
            pass

    def factory(name: str, description: str, tag_keys: tuple[str, ...]) -> Recorder:
        made[name] = tag_keys
        return Recorder()

    assert TritonMetrics(counters=factory).enabled
    labels = {f"ray_{name}_total": set(keys) for name, keys in made.items()}
    gauges: dict[str, tuple[str, ...]] = {}

    class Gauge:
        def set(self, value: float, tags: dict[str, str] | None = None) -> None:
            pass

    def gauge(name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge:
        gauges[name] = tag_keys
        return Gauge()

    RayGauges(gauge, factory).export({("m", "1"): 0}, [])  # the gauges every replica sets
    labels.update({f"ray_{name}": set(keys) for name, keys in gauges.items()})
    return Exported(labels, set())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panels(panel) if "panels" in panel else ()


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target, and of the template variables' ``label_values`` queries."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        for metric, label in _LABEL_VALUES.findall(text):
            yield f"variable {variable['name']}", f"{metric}{{{label}!=''}}"


def check(dashboard: dict[str, Any], exported: Exported) -> list[str]:
    """Every name or label of ``dashboard`` that ``exported`` does not print."""
    problems = []
    for title, expr in expressions(dashboard):
        query = parse(expr)
        if not query.names:
            problems.append(f"{title}: no metric in {expr!r}")
        for name in sorted(unknown(query.names, exported.labels, exported.histograms)):
            problems.append(f"{title}: {name} is not exported")
        families = [exported.labels.get(_family(n, exported), set()) | TARGET_LABELS for n in query.names]
        for name, labels in query.matched.items():
            missing = labels - exported.labels.get(_family(name, exported), set()) - TARGET_LABELS
            problems += [f"{title}: {name} has no label {label}" for label in sorted(missing)]
        common = set.intersection(*families) if families else set()
        problems += [
            f"{title}: not every metric has label {label}" for label in sorted(query.grouped - common)
        ]
    return problems


def _family(name: str, exported: Exported) -> str:
    return next((h for h in exported.histograms if name in (h + s for s in HISTOGRAM_SUFFIXES)), name)


def _load(name: str) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads((GRAFANA / name).read_text())
    return dashboard


@pytest.mark.parametrize(
    ("name", "export"), [("triton_metrics.json", triton_export), ("ray_serve_metrics.json", ray_export)]
)
def test_dashboard_queries_only_exported_families_and_labels(
    name: str, export: Callable[[], Exported]
) -> None:
    dashboard = _load(name)
    assert check(dashboard, export()) == []
    assert sum(1 for _ in expressions(dashboard)) > 10


def test_the_metrics_module_lists_every_family_it_renders() -> None:
    exported = triton_export()
    assert set(exported.labels) == set(FAMILIES)
    assert exported.histograms == set()  # durations are counters, as in Triton's defaults
    assert exported.labels["nv_inference_request_failure"] == {"model", "version", "reason"}
    assert exported.labels["nv_model_host_resident_gpu_bytes"] == {"model"}


def test_each_family_has_a_panel() -> None:
    """A family the server starts printing needs a panel (or a reason here not to have one)."""
    for name, exported in (
        ("triton_metrics.json", triton_export()),
        ("ray_serve_metrics.json", ray_export()),
    ):
        shown = set().union(*(parse(expr).names for _, expr in expressions(_load(name))))
        assert set(exported.labels) - shown == set(), name


def test_ray_export_names_carry_prefix_and_counter_suffix() -> None:
    exported = ray_export()
    assert "ray_nv_inference_request_success_total" in exported.labels
    assert exported.labels["ray_nv_inference_request_failure_total"] == {"model", "version"}


@pytest.mark.parametrize("name", ["triton_metrics.json", "ray_serve_metrics.json"])
def test_dashboard_shape(name: str) -> None:
    dashboard = _load(name)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "label_values(" in variables["model"]["definition"]
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all('model=~"$model"' in t["expr"] or "nv_cpu" in t["expr"] for t in panel["targets"])


def test_parse_reads_names_and_labels_not_functions_variables_or_groupings() -> None:
    query = parse(
        'sum by (model, reason) (rate(nv_inference_request_failure{model=~"$model", version!="1"}'
        "[$__rate_interval])) / ignoring(reason) group_left sum(nv_inference_count offset 5m) * 1e6"
    )
    assert query.names == {"nv_inference_request_failure", "nv_inference_count"}
    assert query.matched == {"nv_inference_request_failure": {"model", "version"}}
    assert query.grouped == {"model", "reason"}
    with pytest.raises(ValueError):
        parse('{__name__=~"nv_.*"}')


def test_check_rejects_wrong_names_labels_and_suffixes() -> None:
    triton = triton_export()
    assert unknown(["nv_inference_count", "nv_inference_exec_count"], triton.labels) == set()
    assert unknown(["nv_inference_request_sucess"], triton.labels) == {"nv_inference_request_sucess"}
    # a counter has no histogram series, and a family whose name ends in _count is not a histogram's
    assert unknown(["nv_inference_request_duration_us_count"], triton.labels, triton.histograms)
    assert unknown(["nv_inference_count"], [], ["nv_inference"]) == set()
    assert unknown(["latency_bucket", "latency_sum", "latency_total"], [], ["latency"]) == {"latency_total"}

    def board(expr: str) -> dict[str, Any]:
        target = {"expr": expr}
        return {"panels": [{"title": "p", "targets": [target]}], "templating": {"list": []}}

    assert (
        check(board('sum by (model) (rate(nv_inference_request_success{model=~"$model"}[5m]))'), triton) == []
    )
    assert check(board("rate(nv_inference_request_succes[5m])"), triton)
    assert check(board("sum by (reason) (rate(nv_inference_request_success[5m]))"), triton)
    assert check(board('nv_model_host_resident{version="1"}'), triton)
    assert check(board("rate(nv_inference_request_success_total[5m])"), ray_export())
    assert check(board("rate(ray_nv_inference_request_success_total[5m])"), triton)
