"""`relevancy-tracer score` as a user runs it: a subprocess against a real HTTP model server."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys

import pytest

from relevancy_tracer_testing import FakeOpenAIServer

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


def start_cli(server, command, *args, rlimit_fsize=None, **env):
    """The CLI as a child process (stdout and stderr piped). SIGINT is SIG_DFL in the child: a
    shell running the suite in the background (`make test &`) passes SIGINT ignored, and the
    CLI keeps an ignored SIGINT ignored. ``rlimit_fsize``: the child's largest file, in bytes
    (writes beyond it fail with EFBIG, as on a full disk)."""
    import resource

    def child_setup():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if rlimit_fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, rlimit_fsize))

    return subprocess.Popen(
        [sys.executable, "-m", "relevancy_tracer.cli", command, *map(str, args), "--no-progress"],
        env={**cli_env(server), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=child_setup,
    )


def towns(path, count):
    path.write_text("".join(json.dumps({"id": i, "question": f"Where is town {i}?", "answer": f"Town {i} is in France."}) + "\n" for i in range(count)))
    return path


def read_output(path):
    if path.suffix == ".jsonl":
        return [json.loads(l) for l in path.read_text().splitlines()]
    if path.suffix == ".csv":
        # fields of any length, as the package reads them (its reader raises this process-wide
        # limit only once it has read a CSV in this process: the test must not depend on that)
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def write_output(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)


def wait_rows_finished(server, rows):
    """With one row at a time, each row sends one embeddings request, and the first one more
    (the failure kind's example sentences, embedded once per process): when row ``rows + 1``
    sends its request, the first ``rows`` rows are finished and handed to the writer."""
    assert server.wait_for_requests("embeddings", rows + 2, timeout=60)


@pytest.mark.parametrize("sig,suffix", [(signal.SIGINT, ".jsonl"), (signal.SIGTERM, ".csv"), (signal.SIGTERM, ".parquet")], ids=["sigint-jsonl", "sigterm-csv", "sigterm-parquet"])
def test_signal_keeps_finished_rows_and_the_old_output_until_the_end(tmp_path, sig, suffix):
    with FakeOpenAIServer(chat_delay=0.2) as server:
        data = towns(tmp_path / "in.jsonl", 40)
        out = tmp_path / f"out{suffix}"
        write_output(out, [{"question": "old", "score": 0.5}])
        proc = start_cli(server, "score", data, "-o", out, RELEVANCY_TRACER_CONCURRENCY="1")
        wait_rows_finished(server, 3)
        assert read_output(out)[0]["question"] == "old"  # the output is replaced at the end only
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(f".out{suffix}.")]
        assert len(temps) == 1
        if suffix == ".jsonl":  # streamed into the temporary file
            assert len(temps[0].read_text().splitlines()) >= 3
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    rows = read_output(out)
    assert 3 <= len(rows) < 40 and all(r["status"] == "scored" for r in rows)
    assert [r["question"] for r in rows] == [f"Where is town {i}?" for i in range(len(rows))]
    summary = summary_of(stderr)
    assert "interrupted" in stderr and summary["not_scored_interrupted"] == 40 - len(rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.jsonl", out.name])  # no temporary file left


def test_output_equal_to_the_input_is_refused(server, tmp_path):
    import os

    data = towns(tmp_path / "in.jsonl", 3)
    before = data.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(data)
    os.link(data, tmp_path / "hard.jsonl")
    for output in (data, tmp_path / "sub" / ".." / "in.jsonl", tmp_path / "link.jsonl", tmp_path / "hard.jsonl"):
        proc = run_cli(server, data, "-o", output)
        assert proc.returncode == 2 and "is the input file" in proc.stderr, (output, proc.stderr)
    proc = run_cli(server, tmp_path / "link.jsonl", "-o", data)  # the other way round
    assert proc.returncode == 2 and "is the input file" in proc.stderr
    assert data.read_bytes() == before and server.requests == []


def test_undecodable_and_over_nested_lines_are_reported_and_the_run_goes_on(server, tmp_path):
    data = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"question": "Where is Paris?", "answer": "Paris is in France."}).encode(),
        b'{"question": "Where is Lyon?", "answer": "Lyon \xff\xfe is in France."}',
        b'{"a": ' * 300 + b"1" + b"}" * 300,  # parses, deeper than the limit
        b"[" * 100000 + b"]" * 100000,  # json itself gives up (RecursionError)
        b'{"question": "Where is Nice?", "answer": "Nice \\ud800 is in France."}',  # half a UTF-16 pair
        json.dumps({"question": "Where is Lille?", "answer": "Lille is in France."}).encode(),
    ]
    data.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    rows = read_output(out)
    assert [r["status"] for r in rows] == ["scored", "invalid_input", "invalid_input", "invalid_input", "invalid_input", "scored"]
    assert [r.get("line") for r in rows[1:5]] == [2, 3, 4, 5]
    assert "line 2: not UTF-8" in rows[1]["error"] and "line 3: JSON nested deeper" in rows[2]["error"] and "line 4: JSON nested too deeply" in rows[3]["error"]
    assert "line 5: a string with a lone surrogate" in rows[4]["error"]
    assert summary_of(proc.stderr)["failures"] == {"invalid_input": 4} and "Traceback" not in proc.stderr


def test_csv_with_a_field_over_128_kib_and_an_undecodable_record(server, tmp_path):
    data = tmp_path / "in.csv"
    long_answer = "Paris is in France. " * 10000  # 200,000 characters
    with open(data, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["question", "answer"])
        writer.writeheader()
        writer.writerow({"question": "Where is Paris?", "answer": long_answer})
    with open(data, "ab") as handle:
        handle.write(b'Where is Lyon?,"Lyon \xff is in France."\r\n')
        handle.write(b"Where is Lille?,Lille is in France.\r\n")
    out = tmp_path / "out.csv"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    rows = read_output(out)
    assert [r["status"] for r in rows] == ["scored", "invalid_input", "scored"]
    assert rows[0]["answer"] == long_answer and rows[0]["truncated"] == "True"
    assert "line 3: not UTF-8" in rows[1]["error"]


def test_parquet_output_with_a_mixed_type_column_is_written_as_strings(server, tmp_path):
    import pyarrow.parquet as pq

    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"Where is town {i}?", "answer": f"Town {i} is in France.", "tags": t}) + "\n" for i, t in [(1, [1, "a"]), ("b-2", ["x"]), (3, None)]))
    out = tmp_path / "out.parquet"
    proc = run_cli(server, data, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "warning: column(s) 'id', 'tags' mix types" in proc.stderr
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["1", "b-2", "3"] and str(table.schema.field("id").type) == "string"
    assert table.column("tags").to_pylist() == ['[1, "a"]', '["x"]', None]
    assert table.column("status").to_pylist() == ["scored"] * 3 and str(table.schema.field("score").type) == "double"


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_write_error_stops_the_run_and_keeps_every_finished_row(tmp_path, suffix):
    """The child may write files of at most 6000 bytes: the output fails after a few rows
    (JSONL; CSV and Parquet: the file their rows wait in until the end). Rows already written
    stay, cut at a whole row; every other finished row goes to stdout, in order."""
    with FakeOpenAIServer() as server:
        data = towns(tmp_path / "in.jsonl", 30)
        out = tmp_path / f"out{suffix}"
        proc = start_cli(server, "score", data, "-o", out, rlimit_fsize=6000, RELEVANCY_TRACER_CONCURRENCY="1")
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert f"cannot write {out}" in stderr and "File too large" in stderr
    written = read_output(out) if out.exists() else []
    rescued = [json.loads(l) for l in stdout.splitlines()]
    if suffix in (".jsonl", ".csv"):  # CSV: the rows held before the refusal fit the limit
        assert 1 <= len(written) < 30 and f"it holds the first {len(written)} row(s)" in stderr
    else:
        assert written == [] and "it was left as it was" in stderr
    kept = written + rescued
    assert len(kept) >= 2 and [int(r["id"]) for r in kept] == list(range(len(kept)))
    assert all(r["status"] == "scored" for r in kept)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_missing_or_binary_input_is_a_clean_error(server, tmp_path):
    proc = run_cli(server, tmp_path / "missing.jsonl", "-o", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and "No such file" in proc.stderr and "Traceback" not in proc.stderr
    binary = tmp_path / "image.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    proc = run_cli(server, binary, "-o", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and "is not a text file" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.jsonl"] and server.requests == []


def test_unknown_input_format_is_a_clean_error(server, tmp_path):
    bad = tmp_path / "data.xml"
    bad.write_text("<x/>")
    proc = run_cli(server, bad)
    assert proc.returncode == 2 and "cannot tell the format" in proc.stderr


def labelled(path, count, extra=b""):
    """``count`` labelled rows (half relevant), then ``extra`` raw lines."""
    rows = [{"question": f"Where is town {i}?", "answer": f"Town {i} is in France." if i % 2 else f"Bananas are yellow {i}.", "label": i % 2} for i in range(count)]
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + extra)
    return path


def test_calibrate_reports_unreadable_lines_refuses_its_input_as_output_and_writes_atomically(server, tmp_path):
    from relevancy_tracer.scoring.calibration import Calibration

    data = labelled(tmp_path / "labelled.jsonl", 12, b'{"question": "Where is Lyon?", "answer": "\xff", "label": 1}\n' + b"[" * 100000 + b"\n")
    before = data.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(data)
    for output in (data, tmp_path / "link.jsonl"):
        proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "calibrate", str(data), "-o", str(output), "--no-progress"], env=cli_env(server), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "is the input file" in proc.stderr, proc.stderr
    assert data.read_bytes() == before and server.requests == []
    calib = tmp_path / "calib.json"
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "calibrate", str(data), "-o", str(calib), "--no-progress"], env=cli_env(server), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipped line 13: not UTF-8" in proc.stderr and "skipped line 14: JSON nested too deeply" in proc.stderr
    assert Calibration.load(calib).fitted_on["rows"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.json", "labelled.jsonl", "link.jsonl"]


def test_calibrate_stopped_by_sigterm_keeps_the_old_calibration(tmp_path):
    with FakeOpenAIServer(chat_delay=0.2) as server:
        data = labelled(tmp_path / "labelled.jsonl", 30)
        calib = tmp_path / "calib.json"
        calib.write_text("old calibration\n")
        proc = start_cli(server, "calibrate", data, "-o", calib, RELEVANCY_TRACER_CONCURRENCY="1")
        wait_rows_finished(server, 2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted after" in stderr and "no calibration written" in stderr
    assert calib.read_text() == "old calibration\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.json", "labelled.jsonl"]


@pytest.mark.parametrize("content", [b'{"cursor": "abc', b"\xff\xfe", b"[1, 2]"], ids=["truncated", "not-utf8", "not-an-object"])
def test_backfill_with_an_unreadable_state_file_is_a_clean_error(server, tmp_path, content):
    """The state is read before Phoenix is contacted (nothing listens on the port given)."""
    from relevancy_tracer._phoenix_server import free_port

    state = tmp_path / "cursor.json"
    state.write_bytes(content)
    command = [sys.executable, "-m", "relevancy_tracer.cli", "backfill", "--phoenix", f"http://127.0.0.1:{free_port()}", "--project", "p", "--state", str(state)]
    proc = subprocess.run(command, env=cli_env(server), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot read the state file {state}" in proc.stderr and "delete it" in proc.stderr and "Traceback" not in proc.stderr
    assert state.read_bytes() == content


def town_rows(count):
    """``count`` JSONL rows (about 80 bytes each) as bytes."""
    return b"".join(json.dumps({"id": i, "question": f"Where is town {i}?", "answer": f"Town {i} is in France."}).encode() + b"\n" for i in range(count))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["fifo", "/dev/stdin", "-", "-csv-bom"])
def test_a_stream_input_is_read_once_and_every_row_scored(server, tmp_path, source):
    # 300 rows, over twice the 8 KiB the binary sniff reads first: a FIFO opened twice
    # waited forever for a second writer; a pipe on /dev/stdin lost the sniffed bytes
    import os
    import threading

    data = town_rows(300)
    assert len(data) > 2 * 8192
    args, stdin = [], subprocess.PIPE
    if source == "fifo":
        fifo = tmp_path / "in.jsonl"
        os.mkfifo(fifo)
        args, stdin = [fifo], subprocess.DEVNULL
    elif source == "-csv-bom":  # Excel's "CSV UTF-8": a byte-order mark before the header
        data = b"\xef\xbb\xbfid,question,answer\r\n" + b"".join(f'{i},Where is town {i}?,"Town {i} is in France."\r\n'.encode() for i in range(300))
        args = ["-", "--format", "csv"]
    else:
        args = [source] + (["--format", "jsonl"] if source != "-" else [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "relevancy_tracer.cli", "score", *map(str, args), "--method", "direct", "--no-progress"],
        env=cli_env(server), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        if source == "fifo":
            def write():
                with open(fifo, "wb") as handle:  # opens once the CLI opened the read end
                    handle.write(data)

            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            stdout, stderr = proc.communicate(timeout=100)
            writer.join(10)
        else:
            stdout, stderr = proc.communicate(data, timeout=100)
    finally:
        proc.kill()  # a CLI that hangs must not outlive the test
    assert proc.returncode == 0, stderr.decode()
    rows = [json.loads(l) for l in stdout.decode().splitlines()]
    assert [str(r["id"]) for r in rows] == [str(i) for i in range(300)]
    assert all(r["status"] == "scored" for r in rows), {r["status"] for r in rows}
    assert summary_of(stderr.decode())["scored"] == 300


def signal_other_threads(pid, sig):
    """Send ``sig`` to every thread of process ``pid`` but its main thread (Linux ``tgkill``):
    a process-directed signal may land on any of them, and one that does cannot interrupt a
    system call blocked in another thread."""
    import ctypes
    import os
    import platform

    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # SYS_tgkill
    libc = ctypes.CDLL(None, use_errno=True)
    threads = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    assert threads  # the reader thread, numpy's BLAS threads
    for tid in threads:
        assert libc.syscall(number, pid, tid, int(sig)) == 0, ctypes.get_errno()


def blocked_in_a_pipe_read(pid, timeout=10.0):
    """Whether a thread of process ``pid`` sleeps in a pipe or FIFO read (its kernel wait
    channel), polled until ``timeout`` seconds: no event tells another process this."""
    import os
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as handle:
                    if "pipe" in handle.read():
                        return True
            except OSError:
                continue
        time.sleep(0.01)
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["process", "other-threads"])
def test_sigterm_while_the_input_blocks_exits_at_once_with_143(server, tmp_path, target):
    # a FIFO whose writer sent half a line and went silent: the read blocks; SIGTERM used to be
    # recorded and the read resumed, for ever; delivered to another thread than the one blocked
    # in the read, it cannot interrupt that read at all
    import os

    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    proc = start_cli(server, "score", fifo, "-o", tmp_path / "out.jsonl")
    with open(fifo, "wb", buffering=0) as writer:  # returns once the CLI has opened the FIFO
        writer.write(b'{"question": "Where is Paris?", "ans')
        assert blocked_in_a_pipe_read(proc.pid)  # waiting for the rest of the line
        if target == "process":
            proc.send_signal(signal.SIGTERM)
        else:
            signal_other_threads(proc.pid, signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted while reading" in stderr and "nothing scored, nothing written" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"] and server.requests == []


def test_output_equal_to_the_file_standard_input_comes_from_is_refused(server, tmp_path):
    data = towns(tmp_path / "in.jsonl", 3)
    before = data.read_bytes()
    with open(data, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "score", "-", "-o", str(data), "--no-progress"], env=cli_env(server), stdin=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is the input file" in proc.stderr, proc.stderr
    assert data.read_bytes() == before and server.requests == []


def test_the_command_docstring_and_the_architecture_page_name_every_command():
    """cli.py's docstring (what ``pydoc relevancy_tracer.cli`` shows) and the architecture
    page's row of cli.py list every subcommand the parser has (before: 3 of 7)."""
    import argparse

    from relevancy_tracer import cli

    from .conftest import ROOT

    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    assert len(commands) == 7
    assert [name for name in commands if f"``{name}" not in (cli.__doc__ or "")] == []
    row = next(line for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines() if "`cli.py`" in line and line.startswith("|"))
    assert [name for name in commands if f"`{name}`" not in row] == []


@pytest.mark.parametrize("target", ["closed-pipe", "/dev/full"])
def test_a_closed_or_full_stdout_ends_the_run_at_once_with_a_message(server, tmp_path, target):
    """`score rows.jsonl | head -1` and `score rows.jsonl > /dev/full`, 300 rows: the first
    failed write cancels the scoring; the process exits 1 with a message naming stdout, no
    traceback (before: a row task died on the write and the in-order output waited for it for
    ever)."""
    data = towns(tmp_path / "in.jsonl", 300)
    out = open("/dev/full", "w") if target == "/dev/full" else subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "relevancy_tracer.cli", "score", str(data), "--no-progress"],
        env=cli_env(server), stdout=out, stderr=subprocess.PIPE, text=True,
    )
    try:
        if target == "closed-pipe":
            assert proc.stdout.readline().startswith("{")  # like `head -1`: one row, then closed
            proc.stdout.close()
        try:
            returncode = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the CLI did not exit within 60 s of its stdout failing")
        stderr = proc.stderr.read()
    finally:
        if out is not subprocess.PIPE:
            out.close()
        if proc.poll() is None:
            proc.kill()
    assert returncode == 1, stderr
    assert "cannot write stdout" in stderr, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr
