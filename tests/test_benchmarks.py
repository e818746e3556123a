"""The fleet benchmark (benchmarks/fleet.py) runs in CI at a small size: real redis-server,
`relevancy-tracer worker` processes, the scripted model server. Throughput figures are the
benchmark's to report (README); what CI asserts is what must hold at any size: every job of
every scaling run is scored, and under overload every span is scored or refused with a
retryable code and re-sent, none lost."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT, subprocess_env


def test_fleet_benchmark_scores_every_job_and_loses_no_span_under_overload(tmp_path):
    out = tmp_path / "fleet.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "fleet.py"), "--workers", "1,2", "--jobs", "40", "--overload-seconds", "3", "--overload-factor", "3", "--queue-bound", "30", "--out", str(out)]
    proc = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]  # exit 1 only means 2 workers < 3x 1 worker
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [run["workers"] for run in result["scaling"]] == [1, 2]
    for run in result["scaling"]:
        assert run["jobs"] == 40 and run["evaluations_per_second"] > 0, run
    overload = result["overload"]
    assert overload["refused_requests"] > 0, overload  # the 30-job bound was reached: backpressure, not loss
    assert overload["lost"] == 0 and overload["scored"] == overload["offered"] > 0, overload
