"""Prometheus rules, Prometheus and Alertmanager configs: promtool/amtool checks, the rules' unit
tests, and one end-to-end run with a real Prometheus and Alertmanager.

The binaries come from Debian (``bash .ci/system-deps``: prometheus, prometheus-alertmanager);
``make test`` installs them, so a missing binary fails these tests.

End to end: ``tests/traced_app.py`` runs in a subprocess as a user's app does —
``relevancy_tracer.configure()`` with ``OTEL_METRICS_EXPORTER=prometheus`` — calling a traced
function 5 times a second, each answer scored in the background against
:class:`~relevancy_tracer_testing.FakeOpenAIServer`, whose embedder (:class:`ScoreDial`) sets
the score: 0.95 (good), then 0.2 (poor), then 0.95 again. Prometheus scrapes the app every
second and evaluates a copy of the production rules whose durations are shortened (same
expressions), sending alerts to Alertmanager, which posts them to a webhook in this test.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import yaml

from relevancy_tracer_testing import FakeOpenAIServer

from benchmarks.alert_traffic import production_traffic_test

from ._observability import (
    COLLECTOR_CONFIG,
    ScoreDial,
    ServerProcess,
    TracedApp,
    binary,
    free_port,
    http_json,
    http_ok,
    prometheus_query,
    wait_until,
)

pytestmark = pytest.mark.prometheus

PROMETHEUS_DIR = COLLECTOR_CONFIG / "prometheus"
RULES = PROMETHEUS_DIR / "relevancy.rules.yml"
RULES_TEST = PROMETHEUS_DIR / "relevancy.rules.test.yml"
PROMETHEUS_YML = PROMETHEUS_DIR / "prometheus.yml"
ALERTMANAGER_YML = COLLECTOR_CONFIG / "alertmanager" / "alertmanager.yml"

QUESTION = "What is the capital of France?"  # tests/traced_app.py's question
SPAN_NAME = "answer_question"  # and its span name
GOOD, POOR = 0.95, 0.2  # scores (dimensionless, in [0, 1])

# Production durations -> end-to-end durations. Range windows and offsets:
E2E_WINDOWS = {"15m": "10s", "30m": "10s", "1h": "10s", "1d": "40s"}
# `for:` durations:
E2E_FOR = {"5m": "2s", "10m": "3s", "15m": "3s"}


def run(cmd: list[str], cwd: Optional[Path] = None, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def rules_of(path: Path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


# ------------------------------------------------------------------------------ static checks


def test_rule_unit_tests_pass():
    """``promtool test rules``: every recording rule's value and every alert's firing and
    not-firing cases over synthetic series (collector-config/prometheus/relevancy.rules.test.yml)."""
    result = run([binary("promtool"), "test", "rules", RULES_TEST.name], cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_cover_every_rule():
    """Every alert has a test where it fires and one where it does not (empty ``exp_alerts``);
    every recording rule's value is checked by a ``promql_expr_test``; the README's alert table
    lists exactly the alerts, in order."""
    rules = rules_of(RULES)
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    alert_tests = [case for group in tests for case in group.get("alert_rule_test", [])]
    expr_tests = [case["expr"] for group in tests for case in group.get("promql_expr_test", [])]
    alerts = [rule["alert"] for rule in rules if "alert" in rule]
    records = [rule["record"] for rule in rules if "record" in rule]
    assert alerts and records
    documented = re.findall(r"^\| `(Relevancy\w+)` \|", (COLLECTOR_CONFIG / "README.md").read_text(), re.M)
    assert documented == alerts, "collector-config/README.md's alert table differs from the rules"
    for alert in alerts:
        cases = [case for case in alert_tests if case["alertname"] == alert]
        assert any(case.get("exp_alerts") for case in cases), f"{alert} is never tested firing"
        assert any(not case.get("exp_alerts") for case in cases), f"{alert} is never tested not firing"
    for record in records:
        assert record in expr_tests, f"recording rule {record} is not checked"


@pytest.mark.parametrize("seed", [1, 2])
def test_shipped_rules_stay_quiet_on_healthy_traffic_and_fire_when_hedges_rise(tmp_path, seed):
    """Issue 33: the shipped rules over a simulated day and a half of a healthy app's traffic
    (4 scored answers a minute drawn from the default's recorded results on the development
    sets, reference answers at the calibration's prior), then two hours where hedges rise to
    30% of the answers: nothing fires on the healthy traffic; the level, low-label, drop and
    hedge alerts fire within their windows once hedges rise."""
    document = production_traffic_test(seed, minutes_healthy=26 * 60, minutes_hedges=120, rules=RULES)
    path = tmp_path / "production.test.yml"
    path.write_text(yaml.safe_dump(document, width=10**9))
    result = run([binary("promtool"), "test", "rules", str(path)], timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_rules_are_valid():
    result = run([binary("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules_of(RULES))} rules found" in result.stdout


def test_prometheus_config_is_valid():
    """``promtool check config`` also checks the rule files it names (relative to the config)."""
    result = run([binary("promtool"), "check", "config", str(PROMETHEUS_YML)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_alertmanager_config_is_valid():
    result = run([binary("amtool"), "check-config", str(ALERTMANAGER_YML)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_and_configs_fail_the_checks_when_broken(tmp_path):
    """The checks above can fail: a broken expression, an alert that no longer fires, and an
    Alertmanager route to an unknown receiver are each rejected."""
    promtool, amtool = binary("promtool"), binary("amtool")
    broken = tmp_path / "broken.rules.yml"
    assert "span:relevancy_low_label:ratio30m > 0.35" in RULES.read_text()
    broken.write_text(RULES.read_text().replace("span:relevancy_low_label:ratio30m > 0.35", "span:relevancy_low_label:ratio30m > ", 1))
    assert run([promtool, "check", "rules", str(broken)]).returncode != 0

    # Only the failure alerts' test group (the score group replays 26 h of samples: slow).
    (tmp_path / "relevancy.rules.yml").write_text(RULES.read_text().replace("span:relevancy_failed:ratio15m > 0.1", "span:relevancy_failed:ratio15m > 0.5", 1))
    unit_tests = yaml.safe_load(RULES_TEST.read_text())
    unit_tests["tests"] = [group for group in unit_tests["tests"] if any(case["alertname"] == "RelevancyEvaluationsFailing" for case in group.get("alert_rule_test", []))]
    (tmp_path / "relevancy.rules.test.yml").write_text(yaml.safe_dump(unit_tests))
    result = run([promtool, "test", "rules", "relevancy.rules.test.yml"], cwd=tmp_path)
    assert result.returncode != 0 and "RelevancyEvaluationsFailing" in result.stdout + result.stderr
    (tmp_path / "relevancy.rules.yml").write_text(RULES.read_text())  # unmutated: the same group passes
    result = run([promtool, "test", "rules", "relevancy.rules.test.yml"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    config["route"]["receiver"] = "nobody"
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    assert run([amtool, "check-config", str(tmp_path / "alertmanager.yml")]).returncode != 0


# ------------------------------------------------------------------------------ end to end


def shorten_durations(text: str) -> str:
    """The rules with production durations replaced by :data:`E2E_WINDOWS` (``[..]`` ranges and
    ``offset``) and :data:`E2E_FOR` (``for:``); raises KeyError for an unmapped duration."""
    text = re.sub(r"\[(\w+)\]", lambda m: f"[{E2E_WINDOWS[m.group(1)]}]", text)
    text = re.sub(r"\boffset (\w+)", lambda m: f"offset {E2E_WINDOWS[m.group(1)]}", text)
    return re.sub(r"(?m)^(\s+for:\s*)(\w+)\s*$", lambda m: m.group(1) + E2E_FOR[m.group(2)], text)


def test_shortened_rules_keep_every_expression():
    """The end-to-end copy differs from the production rules only in durations."""
    production, short = rules_of(RULES), yaml.safe_load(shorten_durations(RULES.read_text()))
    short_rules = [rule for group in short["groups"] for rule in group["rules"]]
    assert len(short_rules) == len(production)
    duration = re.compile(r"\[\w+\]|offset \w+")
    for original, copy in zip(production, short_rules):
        assert duration.sub("D", original["expr"]) == duration.sub("D", copy["expr"])
        assert original.get("labels") == copy.get("labels") and original.get("annotations") == copy.get("annotations")
        if "for" in original:
            assert copy["for"] == E2E_FOR[original["for"]]
    assert "[1d] offset 1h" not in shorten_durations(RULES.read_text())


class WebhookReceiver:
    """Alertmanager's webhook target: an HTTP server on 127.0.0.1 recording every payload."""

    def __init__(self) -> None:
        self.payloads: list[dict] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._changed:
                    receiver.payloads.append(json.loads(body))
                    receiver._changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/relevancy"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def alerts(self) -> list[dict]:
        """Every alert of every payload received, in order (each has ``status``, ``labels``...)."""
        with self._changed:
            return [alert for payload in self.payloads for alert in payload["alerts"]]

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        """The first received alert matching ``predicate``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for payload in self.payloads:
                    for alert in payload["alerts"]:
                        if predicate(alert):
                            return alert
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pytest.fail(f"no {what} notification within {timeout:.0f} s; received: {json.dumps(self.payloads)[:3000]}")
                self._changed.wait(remaining)

    def __enter__(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def e2e_prometheus_config(app: str, alertmanager: str, rules: Path) -> dict:
    """The production prometheus.yml with 1 s intervals, the shortened rules, this test's
    Alertmanager and the app's address (the Collector job is left out: no Collector here)."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(rules)]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    app_job = next(job for job in config["scrape_configs"] if job["job_name"] == "relevancy-app")
    app_job["static_configs"] = [{"targets": [app]}]
    config["scrape_configs"] = [app_job]
    return config


def e2e_alertmanager_config(webhook_url: str) -> dict:
    """The production alertmanager.yml with 1 s grouping delays, posting to ``webhook_url``."""
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    config["route"].update(group_wait="1s", group_interval="1s")
    hooks = [hook for receiver in config["receivers"] for hook in receiver.get("webhook_configs", [])]
    assert hooks, "alertmanager.yml has no webhook receiver"
    for hook in hooks:
        hook["url"] = webhook_url
    return config


def firing_alerts(prometheus: str) -> set[str]:
    """Names of the alerts Prometheus has in state firing."""
    alerts = http_json(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    return {alert["labels"]["alertname"] for alert in alerts if alert["state"] == "firing"}


def test_drift_alert_fires_and_resolves_end_to_end(tmp_path):
    """Good scores, then poor ones: RelevancyLowLabelShareHigh reaches the webhook FIRING, and RESOLVED
    once scores recover; Prometheus also fires the drop, low-label-share and in-process drift
    alerts during the poor phase and nothing before or after. Timings are printed (s)."""
    prometheus_bin = binary("prometheus")
    alertmanager_bin = binary("prometheus-alertmanager", "alertmanager")
    promtool = binary("promtool")
    started = time.monotonic()
    timings: dict[str, float] = {}

    rules = tmp_path / "relevancy.rules.e2e.yml"
    rules.write_text(shorten_durations(RULES.read_text()))
    check = run([promtool, "check", "rules", str(rules)])
    assert check.returncode == 0, check.stdout + check.stderr

    dial = ScoreDial(QUESTION, GOOD)
    app_port, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    alertmanager = f"http://127.0.0.1:{alertmanager_port}"
    with FakeOpenAIServer(embedder=dial) as models, WebhookReceiver() as webhook:
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(e2e_prometheus_config(f"127.0.0.1:{app_port}", f"127.0.0.1:{alertmanager_port}", rules)))
        (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(e2e_alertmanager_config(webhook.url)))
        am_cmd = [
            alertmanager_bin,
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{alertmanager_port}",
            "--cluster.listen-address=",  # no gossip port
        ]
        prom_cmd = [
            prometheus_bin,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ]
        app_env = {
            "OTEL_SERVICE_NAME": "alerting-e2e",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(app_port),
        }
        with ServerProcess(am_cmd, tmp_path / "alertmanager.log") as am, ServerProcess(prom_cmd, tmp_path / "prometheus.log") as prom:
            for server, url in ((am, alertmanager), (prom, prometheus)):
                wait_until(lambda: server.check_running() or http_ok(f"{url}/-/ready"), 30, f"{url}/-/ready")
            with TracedApp(models.base_url, app_env, rate=5.0) as app:
                timings["servers and app up"] = time.monotonic() - started

                def scalar(expr: str) -> Optional[float]:
                    prom.check_running()
                    result = prometheus_query(prometheus, expr)
                    return result[0][1] if result else None

                # Good phase: until the baseline window holds >= 100 scores (the drop alert's
                # guard) and the in-process detector has its window and baseline (150 scores).
                wait_until(
                    lambda: (scalar("span:relevancy_scored:increase1d_offset1h") or 0) >= 100 and (scalar("sum(relevancy_score_count)") or 0) >= 200,
                    90,
                    "a full baseline of good scores",
                )
                timings["good phase"] = time.monotonic() - started - timings["servers and app up"]
                series = prometheus_query(prometheus, "span:relevancy_score:mean30m")
                # one series per traced function and evaluator (a 12-hex version hash)
                (labels,) = [labels for labels, _ in series]
                assert re.fullmatch(r"[0-9a-f]{12}", labels["relevancy_evaluator_version"])
                assert {k: v for k, v in labels.items() if k != "relevancy_evaluator_version"} == {"__name__": "span:relevancy_score:mean30m", "service_name": "alerting-e2e", "span_name": SPAN_NAME}
                assert series[0][1] == pytest.approx(GOOD, abs=1e-3)
                assert scalar("span:relevancy_low_label:ratio1h") == 0
                assert firing_alerts(prometheus) == set() and webhook.alerts() == []

                # Poor phase.
                dial.value = POOR
                poor_start = time.monotonic()
                firing = webhook.wait_for(lambda a: a["labels"]["alertname"] == "RelevancyLowLabelShareHigh" and a["status"] == "firing", 60, "RelevancyLowLabelShareHigh firing")
                timings["poor scores -> FIRING at webhook"] = time.monotonic() - poor_start
                assert firing["labels"] == {"alertname": "RelevancyLowLabelShareHigh", "severity": "critical", "service_name": "alerting-e2e", "span_name": SPAN_NAME}
                share = float(re.match(r"([0-9.]+)% of answer_question's answers over 30m are labelled", firing["annotations"]["summary"]).group(1))
                assert 35 < share <= 100
                expected = {"RelevancyLowLabelShareHigh", "RelevancyScoreDrop", "RelevancyLowLabelShareRising", "RelevancyInProcessDrift"}
                wait_until(lambda: firing_alerts(prometheus) == expected, 60, f"Prometheus firing exactly {sorted(expected)}")
                timings["poor scores -> all four firing in Prometheus"] = time.monotonic() - poor_start
                wait_until(lambda: abs((scalar("span:relevancy_score:mean30m") or 0) - POOR) < 1e-3, 30, f"the recorded mean to reach {POOR}")

                # Recovery.
                dial.value = GOOD
                recovery_start = time.monotonic()
                resolved = webhook.wait_for(lambda a: a["labels"]["alertname"] == "RelevancyLowLabelShareHigh" and a["status"] == "resolved", 60, "RelevancyLowLabelShareHigh resolved")
                timings["good scores -> RESOLVED at webhook"] = time.monotonic() - recovery_start
                assert resolved["labels"] == firing["labels"] and resolved["startsAt"] == firing["startsAt"]
                wait_until(lambda: firing_alerts(prometheus) == set(), 60, "every alert resolved in Prometheus")
                timings["good scores -> nothing firing in Prometheus"] = time.monotonic() - recovery_start
                wait_until(lambda: abs((scalar("span:relevancy_score:mean30m") or 0) - GOOD) < 1e-3, 30, f"the recorded mean to reach {GOOD}")
            assert app.proc.returncode == 0, "".join(app.output)[-3000:]
            assert app.output[-1].startswith("done ")
            am.check_running()
            prom.check_running()
    notified = {alert["labels"]["alertname"] for alert in webhook.alerts()}
    assert not notified & {"RelevancyEvaluationsFailing", "RelevancyEvaluationsDropped"}
    timings["total"] = time.monotonic() - started
    print("end-to-end timings (s): " + ", ".join(f"{name}: {value:.1f}" for name, value in timings.items()))
