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
from ..config import DEFAULT_THRESHOLDS, EVALUATOR_FIELDS, EVIDENCE_THRESHOLDS, PROBABILITY_THRESHOLDS, RAW_FINGERPRINT_FIELDS, Settings  # noqa: F401 (re-exported)
from . import failure, prompts
from .calibration import Calibration
from .methods import METHODS

logger = logging.getLogger("relevancy_tracer")

#: Where calibrations fitted for the embedded default models ship (package data).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "calibrations"


def _sha(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")).hexdigest()


def raw_fingerprint(settings: Settings, llm_name: str, embedding_name: Optional[str], llm_decoding: str = "") -> str:
    """SHA-256 hex of everything that determines the raw score (see the module docstring): the
    settings declared ``evaluator="raw"`` (:data:`~relevancy_tracer.config.RAW_FINGERPRINT_FIELDS`)
    under their names, the method's prompts (:meth:`~.methods.Method.fingerprint_prompts`), the
    system prompt and the models."""
    payload = {name: getattr(settings, name) for name in RAW_FINGERPRINT_FIELDS}
    payload.update(
        prompts=METHODS[settings.method].fingerprint_prompts(settings),
        system=prompts.SYSTEM,
        llm=llm_name,
        llm_decoding=llm_decoding,
        embedding=embedding_name,
    )
    return _sha(payload)


def identity_key(settings: Settings, llm_name: str, embedding_name: Optional[str], llm_decoding: str = "") -> tuple:
    """A hashable key that is equal for two evaluations exactly when their evaluator (raw
    fingerprint, calibration, thresholds) is: the settings of
    :data:`~relevancy_tracer.config.EVALUATOR_FIELDS` and the models."""
    return tuple(getattr(settings, name) for name in EVALUATOR_FIELDS) + (llm_name, embedding_name, llm_decoding)


def thresholds_for(settings: Settings, calibrated: bool) -> tuple[float, float, float]:
    """The label thresholds in use: the setting (on the reported score), else
    :data:`~relevancy_tracer.config.EVIDENCE_THRESHOLDS` on a calibrated score's evidence, else
    :data:`~relevancy_tracer.config.DEFAULT_THRESHOLDS` on the raw score (see
    :func:`labels_on_evidence`)."""
    if settings.thresholds is not None:
        return tuple(settings.thresholds)  # type: ignore[return-value]
    return EVIDENCE_THRESHOLDS if calibrated else DEFAULT_THRESHOLDS


def labels_on_evidence(settings: Settings, calibrated: bool) -> bool:
    """True when labels are read from the evidence (calibrated, no ``thresholds`` setting):
    they then stay the same under any ``relevancy_prior``."""
    return calibrated and settings.thresholds is None


def evaluator_version(raw: str, calibration: Optional[Calibration], thresholds: tuple[float, ...], prior: Optional[float] = None) -> str:
    """12 hex digits identifying the evaluator: raw fingerprint, calibration map and the prior
    it is applied under, label thresholds, failure-kind rules."""
    return _sha({"raw": raw, "calibration": calibration.fingerprint() if calibration else None, "prior": prior, "thresholds": list(thresholds), "failure": failure.fingerprint()})[:12]


@lru_cache(maxsize=64)
def _load_file(path: str, mtime_ns: int) -> Calibration:
    return Calibration.load(path)


def load_calibration(path: str) -> Calibration:
    """A calibration file, cached by path and modification time. Raises OSError, ValueError."""
    resolved = Path(path).expanduser()
    return _load_file(str(resolved), resolved.stat().st_mtime_ns)


def shipped_calibrations(method: Optional[str] = None) -> list[Calibration]:
    """The calibrations shipped in the package for ``method`` (its
    :attr:`~.methods.Method.calibration_glob` in ``relevancy_tracer/calibrations``), or all of
    them (``*.json``) when ``method`` is None."""
    out = []
    for path in sorted(SHIPPED_DIR.glob(METHODS[method].calibration_glob if method else "*.json")):
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


def resolve_calibration(setting: str, raw: str, method: Optional[str] = None) -> Optional[Calibration]:
    """The calibration for a ``calibration`` setting and a raw fingerprint, or None.

    ``none``: None. ``auto``: the calibration shipped for ``method`` (all shipped ones when
    None) that was fitted for exactly this raw fingerprint,
    else None (raw scores are reported; a one-time INFO log says how to fit one). A path: that
    file (a warning, once, when it was fitted for another evaluator). Never raises: an
    unreadable file is logged once and scores stay raw.
    """
    if setting == "none":
        return None
    if setting == "auto":
        for calibration in shipped_calibrations(method):
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
