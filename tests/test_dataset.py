"""Property-based: the dataset reader and writer never lose a line or a row.

``read_rows`` turns any text file into one row per non-blank line, each either data or an
error naming its line (a file with a NUL byte is refused as binary); ``RowWriter`` writes any JSON-like rows to JSONL, CSV and Parquet (columns
of mixed types as strings), renamed into place only at ``close``.
"""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relevancy_tracer.dataset import RowWriter, read_rows

LINE_PARTS = st.sampled_from([b"{", b"}", b"[", b"]", b'"q"', b":", b",", b"1", b"\xff", b"\xc3", b"\\ud800", b" ", b"\r", b'"question": "Q?"', b"null"])
LINES = st.lists(st.one_of(st.binary(max_size=40), st.lists(LINE_PARTS, max_size=30).map(b"".join)), max_size=12)

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3)), max_leaves=6)
ROWS = st.lists(st.dictionaries(st.sampled_from(["id", "question", "answer", "tags", "meta"]), VALUES, max_size=5), max_size=8)


def _blank(raw: bytes, number: int) -> bool:
    """A line the reader skips: UTF-8 text of whitespace only."""
    try:
        return not raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
    except UnicodeDecodeError:
        return False


@settings(max_examples=200, deadline=None)
@given(lines=LINES)
def test_read_rows_gives_every_non_blank_jsonl_line_as_data_or_an_error_with_its_number(lines):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "in.jsonl"
        path.write_bytes(b"\n".join(lines))
        data = b"\n".join(lines)
        if b"\0" in data:  # a binary file is refused as a whole
            with pytest.raises(ValueError, match="not a text file"):
                list(read_rows(path))
            return
        rows = list(read_rows(path))
    physical = data.split(b"\n")[: -1 if data.endswith(b"\n") or not data else None]
    assert [row.line for row in rows] == [n for n, raw in enumerate(physical, start=1) if not _blank(raw, n)]
    for row in rows:
        assert (row.data is None) != (row.error is None)
        if row.error is not None:
            assert row.error.startswith(f"line {row.line}: ")
        else:
            assert isinstance(row.data, dict)
            json.dumps(row.data).encode("utf-8")  # usable text: no lone surrogate


CSV_CELLS = st.text(alphabet=st.sampled_from(['"', ",", "\n", "\r", " ", "a", "é", "\u2028"]), max_size=6)


@settings(max_examples=200, deadline=None)
@given(lines=LINES, limit=st.sampled_from([8, 1 << 20]), chunk=st.sampled_from([1, 3, 1 << 20]))
def test_each_jsonl_row_accounts_for_the_bytes_read_up_to_its_end(lines, limit, chunk):
    """The rows' ``consumed`` bytes (what the progress bar counts) add up, row after row, to
    the byte offset where each row's line ends, for a JSONL file of any bytes (blank lines,
    lines blank in Unicode whitespace only, bad UTF-8, CR, over-long lines skipped in chunks)."""
    from unittest import mock

    import relevancy_tracer.dataset.reading as reading  # the module whose globals read_rows reads

    data = b"\n".join(lines)
    if b"\0" in data[: reading.SNIFF_BYTES]:
        return  # binary: refused
    ends = [0]  # where line n ends (its LF included): a line of the reader ends at LF only
    for raw in data.split(b"\n"):
        ends.append(ends[-1] + len(raw) + 1)
    ends[-1] = len(data)
    with (
        tempfile.TemporaryDirectory() as folder,
        mock.patch.object(reading, "MAX_LINE_BYTES", limit),
        mock.patch.object(reading, "_SKIP_CHUNK", chunk),
    ):
        path = Path(folder) / "in.jsonl"
        path.write_bytes(data)
        rows = list(read_rows(path))
        assert reading.file_extent(path) == ("bytes", len(data))
    total = 0
    for row in rows:
        total += row.consumed
        assert row.consumed > 0 and total == ends[row.line], (row, ends)
    assert total <= len(data)


CSV_CHARS = ['"', ",", "\n", "\r", " ", "a", "é", "\u2028", "\udcff", "😀"]  # \udcff: the byte 0xff
CSV_TEXT = st.text(alphabet=st.sampled_from(CSV_CHARS), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(st.one_of(st.just(None), st.lists(CSV_TEXT, max_size=4)), max_size=8),
    crlf=st.booleans(),
    end=st.booleans(),
    bom=st.booleans(),
    chunk=st.sampled_from([1, 3, 1 << 20]),
)
def test_each_csv_row_accounts_for_the_bytes_read_up_to_its_end(records, crlf, end, bom, chunk):
    """For any CSV as csv.writer writes it (quotes, commas and newlines inside fields, blank
    lines, CRLF or LF, a byte-order mark, bytes that are not UTF-8 (``\\udcff``: the byte
    0xff), with or without a final newline), the rows' ``consumed`` bytes add up to the whole
    file, and the bytes up to each row's end read as a file give exactly the rows before."""
    import io as _io
    from unittest import mock

    import relevancy_tracer.dataset.reading as reading  # the module whose globals read_rows reads

    text = _io.StringIO()
    writer = csv.writer(text, lineterminator="\r\n" if crlf else "\n")
    writer.writerow(["question", "answer"])
    for record in records:
        if record is None:
            text.write("\r\n" if crlf else "\n")  # a blank line: skipped by DictReader
        else:
            writer.writerow(record)
    writer.writerow(["last"])  # the file ends with a row: every byte belongs to one
    data = (b"\xef\xbb\xbf" if bom else b"") + text.getvalue().encode("utf-8", "surrogateescape")
    if not end:
        data = data[: -2 if crlf else -1]
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(reading, "_SKIP_CHUNK", chunk):
        path = Path(folder) / "in.csv"
        path.write_bytes(data)
        rows = list(read_rows(path))
        assert sum(row.consumed for row in rows) == len(data)
        offset = 0
        for count, row in enumerate(rows, start=1):
            offset += row.consumed
            path.write_bytes(data[:offset])
            before = list(read_rows(path))
            assert [(r.data, r.error) for r in before] == [(r.data, r.error) for r in rows[:count]]


def test_the_progress_extent_is_bytes_for_text_rows_for_parquet_and_none_for_streams(tmp_path):
    """JSONL and CSV: the file's size; Parquet: the footer's row count; none for standard
    input, a FIFO or a missing file."""
    import os

    from relevancy_tracer.dataset import file_extent

    writer = RowWriter(tmp_path / "in.parquet")
    for i in range(2500):
        writer.write({"question": f"q{i}", "answer": "a"})
    writer.close()
    assert file_extent(tmp_path / "in.parquet") == ("rows", 2500)
    assert len(list(read_rows(tmp_path / "in.parquet"))) == 2500
    (tmp_path / "in.csv").write_bytes(b"question,answer\nq,a\n")
    assert file_extent(tmp_path / "in.csv") == ("bytes", 20) == file_extent(tmp_path / "in.csv", "jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    assert file_extent(tmp_path / "fifo.jsonl") is None and file_extent("-") is None
    assert file_extent(tmp_path / "missing.jsonl") is None and file_extent(tmp_path / "in.txt") is None


@pytest.mark.parametrize("value", [{}, [{}], {"a": {}}, [[{}]], {"a": [{}]}])
def test_parquet_stores_values_arrow_types_as_empty_structs_as_text(value):
    """Hypothesis found ``{'id': [{}]}``: Arrow types it as a list of a struct with no fields,
    which Parquet cannot store; the column is written as JSON text (a top-level dict always is),
    and no row is lost."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "out.parquet"
        writer = RowWriter(path)
        writer.write({"id": value, "n": 1})
        writer.close()
        table = pq.read_table(path)
        assert table.num_rows == 1 and writer.stringified == ([] if isinstance(value, dict) else ["id"])  # dicts: JSON already
        assert json.loads(table.column("id")[0].as_py()) == value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=ROWS, kind=st.sampled_from(["jsonl", "csv", "parquet"]))
def test_row_writer_writes_every_row_of_any_shape(rows, kind):
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"out.{kind}"
        writer = RowWriter(path)
        for row in rows:
            writer.write(row)
        assert not path.exists()  # renamed into place at close only
        writer.close()
        assert [p.name for p in Path(folder).iterdir()] == [path.name] and writer.written == len(rows)
        if kind == "jsonl":
            back = [json.loads(line) for line in path.read_text().split("\n")[:-1]]  # not splitlines: U+0085 is in text
            assert back == json.loads(json.dumps(rows))
        elif kind == "csv":
            with open(path, newline="") as handle:
                assert len(list(csv.DictReader(handle))) == (len(rows) if any(rows) else 0)
        else:
            assert pq.read_table(path).num_rows == (len(rows) if any(rows) else 0)


def _feed_fifo(path: Path, data: bytes) -> "threading.Thread":
    """Create a FIFO at ``path`` and write ``data`` into it from a thread (the open blocks until
    the reader opens it); the writer closes it at the end (EOF for the reader)."""
    import os
    import threading

    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as handle:
            handle.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(60)  # read twice, the FIFO's second open waited forever
def test_a_fifo_is_opened_once_and_read_whole(tmp_path):
    # 300 rows, 3x the NUL sniff's 8 KiB: the sniff's bytes are rows too, and a second open of
    # the FIFO would wait for a writer that never comes
    rows = [{"id": i, "question": f"Where is town {i}?", "answer": f"Town {i} is in France, not far from the sea."} for i in range(300)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    assert len(data) > 3 * 8192
    writer = _feed_fifo(tmp_path / "in.jsonl", data)
    got = list(read_rows(tmp_path / "in.jsonl"))
    writer.join(10)
    assert [r.data for r in got] == rows and [r.line for r in got] == list(range(1, 301))


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, kind):
    path = tmp_path / f"in.{kind}"
    if kind == "jsonl":
        text = "".join(json.dumps({"question": f"Q{i}?", "answer": f"A{i}."}) + "\n" for i in range(3))
    else:
        sep = "\t" if kind == "tsv" else ","
        text = f"question{sep}answer\r\n" + "".join(f"Q{i}?{sep}A{i}.\r\n" for i in range(3))
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # Excel's "CSV UTF-8" starts so
    rows = list(read_rows(path))
    assert [r.data for r in rows] == [{"question": f"Q{i}?", "answer": f"A{i}."} for i in range(3)]


@pytest.mark.parametrize("newline_after", [True, False])
def test_a_line_longer_than_the_limit_is_an_invalid_row_never_held_whole(tmp_path, newline_after):
    """A 100 MiB line (a file with no newline at all, or one huge row between two good ones)
    becomes one ``invalid_input`` row, read in chunks and dropped: the reader's peak
    allocation stays near the 16 MiB line limit, not the line's size."""
    import tracemalloc

    from relevancy_tracer.dataset import MAX_LINE_BYTES

    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as handle:
        if newline_after:
            handle.write(b'{"question": "q1", "answer": "a1"}\n')
        handle.write(b'{"question": "' + b"x" * (100 << 20))
        if newline_after:
            handle.write(b'"}\n{"question": "q2", "answer": "a2"}\n')
    tracemalloc.start()
    try:
        rows = list(read_rows(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * MAX_LINE_BYTES, peak
    errors = [row for row in rows if row.error]
    assert len(errors) == 1 and "longer than 16 MiB" in errors[0].error
    if newline_after:
        assert [row.data for row in rows if not row.error] == [{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}]
        assert [row.line for row in rows] == [1, 2, 3]


def test_parquet_columns_are_typed_across_write_batches(tmp_path):
    """A CSV/Parquet output is written in batches of WRITE_BATCH_ROWS rows: a column's type is
    decided over all of them, as for one table of every row (ints then floats: double; ints
    then strings: strings; a column seen only late: nulls before it)."""
    import pyarrow.parquet as pq

    from relevancy_tracer.dataset import WRITE_BATCH_ROWS, arrow_table

    half = WRITE_BATCH_ROWS + 300
    rows = [{"id": i, "n": i, "mixed": i} for i in range(half)] + [{"id": half + i, "n": i + 0.5, "mixed": f"s{i}", "late": [i]} for i in range(half)]
    path = tmp_path / "out.parquet"
    writer = RowWriter(path)
    for row in rows:
        writer.write(row)
    assert writer.pending == len(rows) and not path.exists()
    writer.close()
    expected, mixed = arrow_table(rows)
    table = pq.read_table(path)
    assert writer.written == len(rows) and writer.stringified == mixed == ["mixed"]
    assert table.schema == expected.schema and table.equals(expected)
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]  # the held rows' file is gone


def test_a_failed_csv_write_gives_every_held_row_back(tmp_path, monkeypatch):
    path = tmp_path / "out.csv"
    writer = RowWriter(path)
    rows = [{"id": i, "text": f"row {i}"} for i in range(2500)]
    for row in rows:
        writer.write(row)

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("csv.DictWriter.writerows", refuse)
    with pytest.raises(OSError):
        writer.close()
    assert list(writer.pending_rows()) == rows and not path.exists()
