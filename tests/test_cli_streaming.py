"""`relevancy-tracer score` streams its input: memory does not grow with the file (the adversary's
question for the files path: a dataset larger than memory), rows are read at most a window
ahead of the in-order output, and a file that cannot be read is an error before anything is
scored or written."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from relevancy_tracer.batch.rows import RowStream
from relevancy_tracer.batch.score import MIN_WINDOW, window_for

from .test_cli import cli_env, run_cli, summary_of

#: Peak memory of the CLI scoring the large input, as a multiple of its peak on a small one
#: (the same rows, 1/20 as many), measured in the same run.
MEMORY_RATIO_BUDGET = 1.25

PEAK_RSS = """
import resource, sys
from relevancy_tracer import cli
status = cli.main(sys.argv[1:])
print("peak_rss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(status)
"""


def rows_without_an_answer(path, count, pad=2000):
    """``count`` JSONL rows of about ``pad`` bytes, each without an answer column: every row
    ends ``invalid_input`` without a model call, so the run measures reading and writing."""
    filler = "x" * pad
    with open(path, "w") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": i, "question": f"Where is town {i}?", "pad": filler}) + "\n")
    return path


def peak_rss_kib(server, path, out):
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, "score", str(path), "-o", str(out)],  # with the progress bar
        env=cli_env(server), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = summary_of(proc.stderr)
    peak = int([l for l in proc.stderr.splitlines() if l.startswith("peak_rss_kib")][-1].split()[1])
    return peak, summary


def output_ids(out):
    if out.suffix == ".jsonl":
        with open(out) as handle:
            return [json.loads(line)["id"] for line in handle]
    if out.suffix == ".csv":
        import csv

        with open(out, newline="") as handle:
            return [int(row["id"]) for row in csv.DictReader(handle)]
    import pyarrow.parquet as pq

    return pq.read_table(out, columns=["id"]).column("id").to_pylist()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_memory_does_not_grow_with_the_input(server, tmp_path, kind):
    """A 400 MB JSONL of 200,000 rows against 10,000 of the same rows: the peak RSS stays
    within 1.25x of the small run's (before: every row and result held, 12x for JSONL). A
    JSONL output is written as rows finish; CSV and Parquet rows wait on disk until the end."""
    small = rows_without_an_answer(tmp_path / "small.jsonl", 10_000)
    large = rows_without_an_answer(tmp_path / "large.jsonl", 200_000)
    small_peak, small_summary = peak_rss_kib(server, small, tmp_path / f"small.out.{kind}")
    large_peak, large_summary = peak_rss_kib(server, large, tmp_path / f"large.out.{kind}")
    assert small_summary["failures"] == {"invalid_input": 10_000} and large_summary["failures"] == {"invalid_input": 200_000}
    assert large_peak <= MEMORY_RATIO_BUDGET * small_peak, (large_peak, small_peak, large.stat().st_size)
    assert output_ids(tmp_path / f"large.out.{kind}") == list(range(200_000))  # every row, in input order
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["small.jsonl", "large.jsonl", f"small.out.{kind}", f"large.out.{kind}"])
    assert server.requests == []


class Reader:
    """Starts a RowStream and collects what it delivers; ``auto``: release each row at once."""

    def __init__(self, stream: RowStream) -> None:
        self.stream = stream
        self.delivered: list = []
        self.auto = False
        self.arrived = threading.Condition()
        stream.start(self.deliver)

    def deliver(self, row) -> None:
        if self.auto and row is not None:
            self.stream.release(row)
        with self.arrived:
            self.delivered.append(row)
            self.arrived.notify_all()

    def wait_for(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.delivered) >= count, timeout=10), len(self.delivered)
            assert len(self.delivered) == count  # not one more than the window allows


def test_rows_are_read_at_most_a_window_ahead_of_the_output(tmp_path):
    """The reading thread stops once ``window`` rows are out and none was released, and reads
    exactly one more per release."""
    path = rows_without_an_answer(tmp_path / "in.jsonl", 100, pad=10)
    reader = Reader(RowStream(str(path), None, None, window=10))
    reader.wait_for(10)
    assert reader.stream.full and reader.stream.read == 10 and not reader.stream.ended.is_set()
    for row in reader.delivered[:5]:
        reader.stream.release(row)
    reader.wait_for(15)
    assert reader.stream.full
    reader.auto = True
    for row in reader.delivered[5:15]:
        reader.stream.release(row)
    with reader.arrived:
        assert reader.arrived.wait_for(lambda: len(reader.delivered) == 101, timeout=10)
    assert reader.delivered[-1] is None and [row.data["id"] for row in reader.delivered[:-1]] == list(range(100))
    assert reader.stream.ended.is_set() and reader.stream.error is None


def test_rows_are_read_at_most_a_byte_budget_ahead(tmp_path, monkeypatch):
    """Large rows: the reader stops at the byte budget before the row window (here 3,000 bytes
    of rows of about 1,040 bytes: 3 rows out of a window of 50)."""
    from relevancy_tracer.batch import rows

    monkeypatch.setattr(rows, "MAX_BYTES_AHEAD", 3000)
    path = rows_without_an_answer(tmp_path / "in.jsonl", 20, pad=1000)
    reader = Reader(RowStream(str(path), None, None, window=50))
    reader.wait_for(3)
    assert reader.stream.full and all(row.size > 1000 for row in reader.delivered)
    reader.stream.release(reader.delivered[0])
    reader.wait_for(4)
    reader.stream.stop()


def test_the_window_keeps_every_slot_busy():
    assert window_for(1) == MIN_WINDOW and window_for(64) == 512


def test_the_limit_stops_reading(server, tmp_path):
    path = rows_without_an_answer(tmp_path / "in.jsonl", 500, pad=10)
    proc = run_cli(server, path, "-o", tmp_path / "out.jsonl", "--limit", "7")
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc.stderr)["rows"] == 7 and len((tmp_path / "out.jsonl").read_text().splitlines()) == 7


@pytest.mark.parametrize("content", [b"\0binary", None])
def test_an_input_that_cannot_be_read_is_an_error_before_anything_is_written(server, tmp_path, content):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "score", str(path), "-o", str(out), "--no-progress"], env=cli_env(server), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("NUL" in proc.stderr) if content else ("No such file" in proc.stderr or "not found" in proc.stderr.lower()), proc.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == (["in.jsonl"] if content else [])


def test_the_progress_bar_counts_a_files_bytes_and_a_pipes_rows(server, tmp_path):
    """A regular JSONL or CSV file's bar counts the bytes of the rows scored up to the file's
    size: exact, and the file is read once. Standard input has no size, so its bar counts rows
    without a total; so does ``--limit`` (up to the limit, or the rows there were), and Parquet
    (up to its footer's row count)."""
    from tqdm import tqdm

    from relevancy_tracer.dataset import RowWriter

    path = rows_without_an_answer(tmp_path / "in.jsonl", 40, pad=10)
    with open(path, "a") as handle:
        handle.write("\n \n" * 100)  # blank lines after the last row: the bar still ends at the file's size
    size = tqdm.format_sizeof(path.stat().st_size, divisor=1024)
    command = [sys.executable, "-m", "relevancy_tracer.cli", "score"]

    def score(source, *more, stdin=None):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.jsonl"
        command_line = command + [str(source), "-o", str(out), *more]
        env = cli_env(server)
        proc = subprocess.run(command_line, stdin=stdin, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    from_file = score(path)
    with open(path, "rb") as handle:
        from_pipe = score("-", stdin=handle)
    assert summary_of(from_file)["rows"] == summary_of(from_pipe)["rows"] == 40
    assert "100%|" in from_file and f"{size}/{size} [" in from_file and "40 rows]" in from_file, from_file
    assert "%|" not in from_pipe and "40row [" in from_pipe, from_pipe
    assert "5/5 [" in score(path, "--limit", "5")
    assert "100%|" in (more := score(path, "--limit", "100")) and "40/40 [" in more, more
    writer = RowWriter(tmp_path / "in.parquet")
    for i in range(30):
        writer.write({"id": i, "question": f"Where is town {i}?"})
    writer.close()
    assert "30/30 [" in score(tmp_path / "in.parquet")
