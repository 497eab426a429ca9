"""docs/grafana/hysync.json: a dashboard Grafana imports, whose every query names a
metric the code exports (hysync/prometheus.py EXPORTED), with the panels the operator needs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hysync.prometheus import EXPORTED

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "hysync.json"
PANEL_TYPES = {"timeseries", "state-timeline", "table", "stat", "bargauge", "gauge"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ()}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bhysync_[a-z0-9_]+", expr))


def exported(name: str) -> bool:
    """`name` as a query writes it is a sample of an exported family of the right type."""
    if EXPORTED.get(name) == "gauge":
        return True
    return any(name == base + suffix for base, kind in EXPORTED.items()
               for suffix in SUFFIXES[kind])


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    inputs = {i["name"] for i in d["__inputs"] if i["type"] == "datasource"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for source in [p["datasource"]] + [t["datasource"] for t in p["targets"]]:
            assert source["type"] == "prometheus"
            assert source["uid"].strip("${}") in inputs, p["title"]
    for var in d["templating"]["list"]:
        assert var["datasource"]["uid"].strip("${}") in inputs


def test_every_query_names_an_exported_metric_and_the_needed_panels_are_there() -> None:
    d = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in d["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in d["templating"]["list"]]
    used = set().union(*map(metric_names, queries))
    assert used and all(exported(n) for n in used), sorted(n for n in used if not exported(n))
    by_metric: dict[str, set[str]] = {}
    for p in d["panels"]:
        for t in p["targets"]:
            for name in metric_names(t["expr"]):
                by_metric.setdefault(name, set()).add(p["type"])
    assert "state-timeline" in by_metric["hysync_job_slot_mode_value"]  # the mode timeline
    assert "timeseries" in by_metric["hysync_job_rounds_closed_total"]  # rounds/s
    assert "timeseries" in by_metric["hysync_worker_contributions_total"]  # per-worker pace
    assert "timeseries" in by_metric["hysync_switch_drops_total"]  # drops


def test_the_check_catches_a_query_of_a_metric_nobody_exports() -> None:
    assert not exported("hysync_job_rounds_closed")  # a counter is queried with _total
    assert not exported("hysync_rounds_per_second")
    assert exported("hysync_p4runtime_write_duration_seconds_bucket")
