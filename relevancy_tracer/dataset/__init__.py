"""Datasets for batch scoring: column mapping (:mod:`.columns`), JSONL / CSV / Parquet input
(:mod:`.reading`) and output with atomic writes (:mod:`.writing`). This package only hands
their names on, so ``relevancy_tracer.dataset`` stays the one place to import them from.
"""

from .columns import DEFAULT_ANSWER_COLUMNS, DEFAULT_CONTEXTS_COLUMNS, DEFAULT_HISTORY_COLUMNS, DEFAULT_QUESTION_COLUMNS, Column, ColumnMapping, iter_rows, resolve_path
from .reading import MAX_JSON_DEPTH, MAX_LINE_BYTES, PARQUET_BATCH_ROWS, SNIFF_BYTES, STDIN, InputRow, file_extent, format_of, read_rows, same_file
from .writing import WRITE_BATCH_ROWS, AtomicFile, RowWriter, arrow_table, write_atomically

__all__ = [
    "DEFAULT_ANSWER_COLUMNS", "DEFAULT_CONTEXTS_COLUMNS", "DEFAULT_HISTORY_COLUMNS", "DEFAULT_QUESTION_COLUMNS",
    "MAX_JSON_DEPTH", "MAX_LINE_BYTES", "PARQUET_BATCH_ROWS", "SNIFF_BYTES", "STDIN", "WRITE_BATCH_ROWS",
    "AtomicFile", "Column", "ColumnMapping", "InputRow", "RowWriter",
    "arrow_table", "file_extent", "format_of", "iter_rows", "read_rows", "resolve_path", "same_file", "write_atomically",
]
