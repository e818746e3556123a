"""Column mapping: where a row of a dataset, or the arguments of a traced call, hold the
question, the answer, the contexts and the conversation's earlier turns.

By default the columns ``question``/``answer``/``contexts`` or the names of
RAGAS's ``ResponseRelevancy`` (``user_input``/``response``/``retrieved_contexts``, as wrappers
of it such as ValidMind's use them) are used; a column can instead be named explicitly, given as a dotted path
into nested JSON (``prediction.generated_answer``, ``messages.0.content``), or given as a
callable ``fn(row) -> value``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Union

Column = Union[str, Callable[[Any], Any], None]

DEFAULT_QUESTION_COLUMNS = ("question", "user_input", "query")
DEFAULT_ANSWER_COLUMNS = ("answer", "response")
DEFAULT_CONTEXTS_COLUMNS = ("contexts", "retrieved_contexts")
DEFAULT_HISTORY_COLUMNS = ("history", "chat_history")

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
    """Where question, answer, contexts and the conversation's earlier turns live in a row.

    Each field is a column name or dotted path, a callable ``fn(row)``, or None for the
    defaults (see module doc; history: ``history`` or ``chat_history``). ``extract`` raises
    ``KeyError`` when question or answer is missing; missing contexts and history are None.
    """

    question: Column = None
    answer: Column = None
    contexts: Column = None
    history: Column = None

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

    def extract_history(self, row: Any) -> Any:
        """The earlier turns of ``row`` as found (None when there is no such column): a list of
        ``{"role", "content"}`` messages, parsed from JSON text when the cell holds text (CSV),
        and a list when the cell holds an array (Parquet through pandas). Not validated here:
        :func:`~relevancy_tracer.scoring.conversation.read_history` does that."""
        value = self._get(row, self.history, DEFAULT_HISTORY_COLUMNS, False)
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                return json.loads(value)
            except ValueError:
                return value  # read_history refuses it: the row is judged as single-turn
        tolist = getattr(value, "tolist", None)
        if callable(tolist) and not isinstance(value, (list, tuple, dict)):
            try:
                value = tolist()
            except Exception:
                return value
        return value


def iter_rows(rows: Iterable[Any]) -> Iterator[Any]:
    """Rows of a list/iterable of mappings, or of a pandas DataFrame (as dicts)."""
    to_dict = getattr(rows, "to_dict", None)
    if callable(to_dict) and hasattr(rows, "columns"):
        yield from to_dict("records")
        return
    yield from rows

