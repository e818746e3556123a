"""Datasets for batch scoring: column mapping, and JSONL / CSV / Parquet input and output.

Column mapping follows seed 004 (validmind's RAGAS wrapper): by default the columns
``question``/``answer``/``contexts`` or the RAGAS names ``user_input``/``response``/
``retrieved_contexts`` are used; a column can instead be named explicitly, given as a dotted path
into nested JSON (``prediction.generated_answer``, ``messages.0.content``), or given as a
callable ``fn(row) -> value``.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

Column = Union[str, Callable[[Any], Any], None]

DEFAULT_QUESTION_COLUMNS = ("question", "user_input", "query")
DEFAULT_ANSWER_COLUMNS = ("answer", "response")
DEFAULT_CONTEXTS_COLUMNS = ("contexts", "retrieved_contexts")

_MISSING = object()


def resolve_path(obj: Any, path: str) -> Any:
    """The value at ``path`` in ``obj``: a key as given, else a dotted path through mappings,
    attributes and list indices. Raises ``KeyError`` when it does not exist."""
    if isinstance(obj, dict) and path in obj:
        return obj[path]
    current = obj
    for part in path.split("."):
        if isinstance(current, dict):
            if part not in current:
                raise KeyError(path)
            current = current[part]
        elif isinstance(current, (list, tuple)) and part.lstrip("-").isdigit():
            try:
                current = current[int(part)]
            except IndexError as exc:
                raise KeyError(path) from exc
        else:
            value = getattr(current, part, _MISSING)
            if value is _MISSING:
                raise KeyError(path)
            current = value
    return current


@dataclass(frozen=True)
class ColumnMapping:
    """Where question, answer and contexts live in a row.

    Each field is a column name or dotted path, a callable ``fn(row)``, or None for the
    defaults (see module doc). ``extract`` raises ``KeyError`` when question or answer is
    missing; missing contexts are None.
    """

    question: Column = None
    answer: Column = None
    contexts: Column = None

    @staticmethod
    def _get(row: Any, column: Column, defaults: tuple[str, ...], required: bool) -> Any:
        if callable(column):
            return column(row)
        if column is not None:
            return resolve_path(row, column)
        for name in defaults:
            try:
                return resolve_path(row, name)
            except KeyError:
                continue
        if required:
            raise KeyError(f"none of the columns {', '.join(defaults)}")
        return None

    def extract(self, row: Any) -> tuple[Any, Any, Any]:
        """(question, answer, contexts) of ``row``; values are not validated here."""
        question = self._get(row, self.question, DEFAULT_QUESTION_COLUMNS, True)
        answer = self._get(row, self.answer, DEFAULT_ANSWER_COLUMNS, True)
        contexts = self._get(row, self.contexts, DEFAULT_CONTEXTS_COLUMNS, False)
        if isinstance(contexts, str) and contexts.lstrip().startswith("["):
            try:  # CSV cells hold lists as JSON text
                contexts = json.loads(contexts)
            except ValueError:
                pass
        return question, answer, contexts


def iter_rows(rows: Iterable[Any]) -> Iterator[Any]:
    """Rows of a list/iterable of mappings, or of a pandas DataFrame (as dicts)."""
    to_dict = getattr(rows, "to_dict", None)
    if callable(to_dict) and hasattr(rows, "columns"):
        yield from to_dict("records")
        return
    yield from rows


@dataclass
class InputRow:
    """One input record: its 1-based line (JSONL/CSV data line) and the data or a read error."""

    line: int
    data: Optional[dict]
    error: Optional[str] = None


def _format_of(path: Path, explicit: Optional[str] = None) -> str:
    if explicit:
        return explicit
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path} (use .jsonl, .csv or .parquet, or --format)")


def read_rows(path: Union[str, Path], fmt: Optional[str] = None) -> Iterator[InputRow]:
    """Records of a JSONL, CSV or Parquet file. A malformed JSONL line is an ``InputRow`` with
    ``error`` set and its line number, not an exception; blank lines are skipped."""
    path = Path(path)
    kind = _format_of(path, fmt)
    if kind == "jsonl":
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except ValueError as exc:
                    yield InputRow(number, None, f"line {number}: not JSON ({exc})")
                    continue
                if not isinstance(data, dict):
                    yield InputRow(number, None, f"line {number}: expected a JSON object, got {type(data).__name__}")
                    continue
                yield InputRow(number, data)
    elif kind == "csv":
        with open(path, encoding="utf-8", newline="") as handle:
            delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
            for number, record in enumerate(csv.DictReader(handle, delimiter=delimiter), start=2):
                yield InputRow(number, dict(record))
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("Parquet needs pyarrow: pip install 'relevancy-tracer[pandas]'") from exc
        for number, record in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield InputRow(number, record)


class RowWriter:
    """Writes output rows to JSONL (streamed, one flushed line per row), or CSV or Parquet
    (buffered and written at :meth:`close`, so columns are the union over all rows)."""

    def __init__(self, path: Union[str, Path], fmt: Optional[str] = None):
        self.path = Path(path)
        self.kind = _format_of(self.path, fmt)
        self._buffer: list[dict] = []
        self._handle: Any = None
        if self.kind == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError as exc:
                raise ImportError("Parquet needs pyarrow: pip install 'relevancy-tracer[pandas]'") from exc
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.kind == "jsonl":
            self._handle = open(self.path, "w", encoding="utf-8")

    def write(self, row: dict) -> None:
        if self.kind == "jsonl":
            self._handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            self._handle.flush()
        else:
            self._buffer.append(row)

    def close(self) -> None:
        if self.kind == "jsonl":
            self._handle.close()
            return
        # nested values become JSON text in flat formats
        rows = [{k: (json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, (dict, list)) and (self.kind == "csv" or isinstance(v, dict)) else v) for k, v in r.items()} for r in self._buffer]
        tmp = self.path.with_name(self.path.name + ".tmp")
        if self.kind == "csv":
            fields: dict[str, None] = {}
            for row in rows:
                fields.update(dict.fromkeys(row))
            with open(tmp, "w", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(fields))
                writer.writeheader()
                writer.writerows(rows)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, self.path)
