"""Evaluator identity and calibration lookup.

Scores are comparable only when the same evaluator produced them: the same method and weights,
the same prompts, the same models and decoding, the same calibration. A change of any of them
is an evaluator change, not app drift (users of every peer hit this: ragas#1438). So every
result, span and metric point carries ``relevancy.evaluator.version``: 12 hex digits of a SHA-256
over a canonical description of all of it.

Two fingerprints:

* :func:`raw_fingerprint`: everything that determines the raw score (method, weights, prompt
  texts, N, noncommittal rule, generation mode, budgets, model names and decoding). A calibration
  file records the raw fingerprint it was fitted for, and ``calibration="auto"`` applies a
  shipped calibration only when it matches exactly.
* :func:`evaluator_version`: the raw fingerprint plus the calibration and the label thresholds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from .._background import fork as _fork
from ..config import DEFAULT_THRESHOLDS, PROBABILITY_THRESHOLDS, Settings
from . import prompts
from .calibration import Calibration

logger = logging.getLogger("relevancy_tracer")

#: Where calibrations fitted for the embedded default models ship (package data).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "calibrations"


def _sha(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")).hexdigest()


def _method_prompts(method: str, settings: Settings) -> list[Any]:
    """The rendered prompts and schemas a method sends (placeholder texts), for fingerprints."""
    from .methods import COMPOSITE_WEIGHTS, RAGAS_JUDGE

    n = settings.strictness
    questions = [prompts.joint_questions("ANSWER", n), prompts.questions_schema(n)] if settings.generation == "joint" else [prompts.single_question("ANSWER"), prompts.QUESTION_SCHEMA]
    table: dict[str, list[Any]] = {
        "ragas": questions,
        "llm_similarity": questions + [prompts.similarity_ratings("QUESTION", ["GENERATED"] * n), prompts.similarity_schema(n)],
        "direct": [prompts.direct_score("QUESTION", "ANSWER"), prompts.SCORE_SCHEMA],
        "decomposition": [prompts.decompose("QUESTION"), prompts.DECOMPOSE_SCHEMA, prompts.coverage("ANSWER", ["SUB"]), prompts.coverage_schema(1)],
        "intent": [prompts.intent("QUESTION"), prompts.INTENT_SCHEMA, prompts.fulfilment("QUESTION", "ANSWER", "INTENT"), prompts.SCORE_SCHEMA],
        "ragas_judge": questions + [prompts.judge_turn(questions[0] + [{"role": "assistant", "content": "REPLY"}], "QUESTION"), prompts.SCORE_SCHEMA, RAGAS_JUDGE],
    }
    if method in table:
        return table[method]
    weights = settings.combined_weights if method == "combined" else COMPOSITE_WEIGHTS.get(method, ())
    out: list[Any] = [["weights", [list(w) for w in weights]]]
    for name, _ in weights:
        out.extend(_method_prompts(name, settings))
    return out


def raw_fingerprint(settings: Settings, llm_name: str, embedding_name: Optional[str], llm_decoding: str = "") -> str:
    """SHA-256 hex of everything that determines the raw score (see the module docstring)."""
    payload = {
        "method": settings.method,
        "prompts": _method_prompts(settings.method, settings),
        "system": prompts.SYSTEM,
        "strictness": settings.strictness,
        "noncommittal": settings.noncommittal,
        "generation": settings.generation,
        "temperature": settings.temperature,
        "max_answer_chars": settings.max_answer_chars,
        "max_question_chars": settings.max_question_chars,
        "llm": llm_name,
        "llm_decoding": llm_decoding,
        "embedding": embedding_name,
    }
    return _sha(payload)


def thresholds_for(settings: Settings, calibrated: bool) -> tuple[float, float, float]:
    """The label thresholds in use: the setting, else the default for (un)calibrated scores."""
    if settings.thresholds is not None:
        return tuple(settings.thresholds)  # type: ignore[return-value]
    return PROBABILITY_THRESHOLDS if calibrated else DEFAULT_THRESHOLDS


def evaluator_version(raw: str, calibration: Optional[Calibration], thresholds: tuple[float, ...]) -> str:
    """12 hex digits identifying the evaluator: raw fingerprint, calibration map, thresholds."""
    return _sha({"raw": raw, "calibration": calibration.fingerprint() if calibration else None, "thresholds": list(thresholds)})[:12]


@lru_cache(maxsize=64)
def _load_file(path: str, mtime_ns: int) -> Calibration:
    return Calibration.load(path)


def load_calibration(path: str) -> Calibration:
    """A calibration file, cached by path and modification time. Raises OSError, ValueError."""
    resolved = Path(path).expanduser()
    return _load_file(str(resolved), resolved.stat().st_mtime_ns)


def shipped_calibrations() -> list[Calibration]:
    """Every calibration shipped in the package (``relevancy_tracer/calibrations/*.json``)."""
    out = []
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        try:
            out.append(load_calibration(str(path)))
        except (OSError, ValueError) as exc:  # a broken package file must not break scoring
            logger.warning("relevancy-tracer: ignoring shipped calibration %s (%s)", path.name, exc)
    return out


_warned: set[str] = set()
_warned_lock = threading.Lock()


@_fork.after_fork
def _renew_lock() -> None:
    global _warned_lock
    _warned_lock = threading.Lock()


def _warn_once(key: str, message: str, *args: Any) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def resolve_calibration(setting: str, raw: str) -> Optional[Calibration]:
    """The calibration for a ``calibration`` setting and a raw fingerprint, or None.

    ``none``: None. ``auto``: the shipped calibration fitted for exactly this raw fingerprint,
    else None (raw scores are reported; a one-time INFO log says how to fit one). A path: that
    file (a warning, once, when it was fitted for another evaluator). Never raises: an
    unreadable file is logged once and scores stay raw.
    """
    if setting == "none":
        return None
    if setting == "auto":
        for calibration in shipped_calibrations():
            if calibration.fitted_on.get("raw_fingerprint") == raw:
                return calibration
        with _warned_lock:
            first = ("auto", raw) not in _warned
            _warned.add(("auto", raw))  # type: ignore[arg-type]
        if first:
            logger.info("relevancy-tracer: no calibration ships for this method and these models; scores are raw (fit one with `relevancy-tracer calibrate`)")
        return None
    try:
        calibration = load_calibration(setting)
    except (OSError, ValueError) as exc:
        _warn_once(f"load:{setting}", "relevancy-tracer: cannot read calibration %s (%s); scores are raw", setting, exc)
        return None
    fitted_for = calibration.fitted_on.get("raw_fingerprint")
    if fitted_for and fitted_for != raw:
        _warn_once(f"mismatch:{setting}:{raw}", "relevancy-tracer: calibration %s was fitted for another method, prompts or models; applying it anyway", setting)
    return calibration
