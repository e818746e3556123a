"""The failure kind's two example-sentence similarities of answers (``refusal_sources``,
``refusal_evasion``: :mod:`relevancy_tracer.scoring.failure`), which the quality records do not
hold: computed with the embedded embedder and cached in a gzip JSON file, for
:mod:`benchmarks.production_mix` and :mod:`benchmarks.quality`."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from relevancy_tracer.scoring import failure


def answer_key(text: str) -> str:
    """The cache key of an answer: the first 20 hex digits of its SHA-1."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:20]


def refusal_components(texts: list[str], cache_path: Path) -> dict[str, dict[str, float]]:
    """``{sha1(answer): {"refusal_sources": ..., "refusal_evasion": ...}}`` for ``texts``, from
    the embedded embedder; cached per example-sentence set."""
    examples_key = answer_key(json.dumps([failure.SOURCE_REFUSALS, failure.EVASIONS], ensure_ascii=False))
    cache: dict[str, Any] = {}
    if cache_path.exists():
        cache = json.loads(gzip.decompress(cache_path.read_bytes()))
    if cache.get("examples") != examples_key:
        cache = {"examples": examples_key, "values": {}}
    missing = sorted({t for t in texts if answer_key(t) not in cache["values"]})
    if missing:
        from relevancy_tracer.models.local_embed import USEEmbedder

        embedder = USEEmbedder()
        examples = embedder.embed_sync(list(failure.SOURCE_REFUSALS) + list(failure.EVASIONS))
        examples /= np.linalg.norm(examples, axis=1, keepdims=True)
        k = len(failure.SOURCE_REFUSALS)
        print(f"embedding {len(missing)} answers for the failure kind's example similarities ...", file=sys.stderr)
        for start in range(0, len(missing), 32):
            chunk = missing[start : start + 32]
            units = embedder.embed_sync(chunk)
            units /= np.linalg.norm(units, axis=1, keepdims=True)
            for text, unit in zip(chunk, units):
                cache["values"][answer_key(text)] = {"refusal_sources": round(float(np.max(examples[:k] @ unit)), 5), "refusal_evasion": round(float(np.max(examples[k:] @ unit)), 5)}
        cache_path.write_bytes(gzip.compress(json.dumps(cache, sort_keys=True).encode("utf-8"), mtime=0))
    return cache["values"]
