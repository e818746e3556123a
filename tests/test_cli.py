"""`relevancy-tracer score` as a user runs it: a subprocess against a real HTTP model server."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import pytest

from relevancy_tracer.testing import FakeOpenAIServer

from .conftest import WIKIEVAL, fake_model_env, subprocess_env


def cli_env(server: FakeOpenAIServer) -> dict:
    return subprocess_env(fake_model_env(server), RELEVANCY_TRACER_LLM_MAX_RETRIES="0")


def run_cli(server, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "score", *map(str, args), "--no-progress"], env=cli_env(server), capture_output=True, text=True, timeout=timeout)


def summary_of(stderr: str) -> dict:
    line = [l for l in stderr.splitlines() if "summary " in l][-1]
    return json.loads(line.split("summary ", 1)[1])


def test_scores_wikieval_jsonl_in_input_order(server, tmp_path):
    out = tmp_path / "out.jsonl"
    proc = run_cli(server, WIKIEVAL, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "Unclosed" not in proc.stderr, proc.stderr  # HTTP sessions are closed before exit
    inputs = [json.loads(l) for l in WIKIEVAL.read_text().splitlines() if l.strip()]
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["question"] for r in rows] == [r["question"] for r in inputs]
    for row in rows:
        assert row["status"] == "scored" and 0 <= row["score"] <= 1 and row["label"]
        assert len(row["generated_questions"]) == 3 and len(row["similarities"]) == 3 and len(row["noncommittal"]) == 3
        assert row["poor_answer"] and row["source"]  # input fields are kept
    summary = summary_of(proc.stderr)
    assert summary["rows"] == 10 and summary["scored"] == 10 and summary["failures"] == {}
    assert {"mean", "p10", "p50", "p90", "labels"} <= set(summary)


def test_bad_rows_are_reported_and_the_run_goes_on(server, tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text(
        "\n".join(
            [
                json.dumps({"question": "Where is Paris?", "answer": "Paris is in France."}),
                "{this is not json",
                json.dumps({"question": "Where is Lyon?", "answer": ""}),
                json.dumps(["a", "list"]),
                "",
                json.dumps({"question": "Where is Nice?"}),
                json.dumps({"question": 7, "answer": "Nice is in France."}),
                json.dumps({"question": "Where is Lille?", "answer": "Lille is in France."}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["scored", "invalid_input", "invalid_input", "invalid_input", "invalid_input", "invalid_input", "scored"]
    assert rows[1]["line"] == 2 and "line 2" in rows[1]["error"]
    assert rows[3]["line"] == 4 and "line 6" in rows[4]["error"]
    assert all(r["score"] is None for r in rows[1:6])
    assert summary_of(proc.stderr)["failures"] == {"invalid_input": 5}


def test_csv_in_csv_out_with_ragas_column_names(server, tmp_path):
    data = tmp_path / "in.csv"
    with open(data, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["user_input", "response", "retrieved_contexts"])
        writer.writeheader()
        writer.writerow({"user_input": "Where is Paris?", "response": "Paris is in France.", "retrieved_contexts": json.dumps(["Paris is the capital of France."])})
        writer.writerow({"user_input": "Where is Rome?", "response": "Rome is in Italy.", "retrieved_contexts": ""})
    out = tmp_path / "out.csv"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["user_input"] for r in rows] == ["Where is Paris?", "Where is Rome?"]
    assert all(r["status"] == "scored" and float(r["score"]) > 0 for r in rows)
    assert len(json.loads(rows[0]["generated_questions"])) == 3


def test_parquet_round_trip(server, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "Where is Paris?", "answer": "Paris is in France."}]), data)
    out = tmp_path / "out.parquet"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    (row,) = pq.read_table(out).to_pylist()
    assert row["status"] == "scored" and row["score"] > 0 and len(row["generated_questions"]) == 3


def test_dotted_paths_into_nested_json(server, tmp_path):
    data = tmp_path / "nested.jsonl"
    data.write_text(json.dumps({"input": {"text": "Where is Paris?"}, "prediction": {"generated_answer": "Paris is in France.", "docs": ["Paris..."]}}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli(server, data, "-o", out, "--question-column", "input.text", "--answer-column", "prediction.generated_answer", "--contexts-column", "prediction.docs")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert row["status"] == "scored"
    assert server.requests_to("embeddings")[0]["input"][0] == "Where is Paris?"


def test_method_flag_and_stdout_output(server):
    proc = run_cli(server, WIKIEVAL, "--method", "direct", "--limit", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(rows) == 2 and all(r["method"] == "direct" and r["components"] == {"direct": pytest.approx(0.8)} for r in rows)


def test_ctrl_c_keeps_finished_rows(tmp_path):
    with FakeOpenAIServer(chat_delay=0.4) as server:
        data = tmp_path / "in.jsonl"
        data.write_text("".join(json.dumps({"question": f"Where is town {i}?", "answer": f"Town {i} is in France."}) + "\n" for i in range(40)))
        out = tmp_path / "out.jsonl"
        env = cli_env(server)
        env["RELEVANCY_TRACER_CONCURRENCY"] = "1"
        # SIG_DFL in the child: a shell running the suite in the background (`make test &`)
        # passes SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
        proc = subprocess.Popen(
            [sys.executable, "-m", "relevancy_tracer.cli", "score", str(data), "-o", str(out), "--no-progress"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert 2 <= len(rows) < 40 and all(r["status"] == "scored" for r in rows)
    assert [r["question"] for r in rows] == [f"Where is town {i}?" for i in range(len(rows))]
    summary = summary_of(stderr)
    assert "interrupted" in stderr and summary["not_scored_interrupted"] == 40 - len(rows)


def test_unknown_input_format_is_a_clean_error(server, tmp_path):
    bad = tmp_path / "data.xml"
    bad.write_text("<x/>")
    proc = run_cli(server, bad)
    assert proc.returncode == 2 and "cannot tell the format" in proc.stderr
