"""Quality of the relevancy methods on the development sets, with confidence intervals.

Data (``../shared/data``, see its README_devsets.md; WikiEval beyond its 10 dev rows and the ARES
sets are reserved for independent evaluation and never read here):

* ``human``: ``relevancy_human_en.jsonl``, 392 real answers judged by people (ExpertQA
  usefulness, HaluQuestQA relevance + completeness; label 1 = addresses the question).
  Reported per subset: AUROC of the raw score, balanced accuracy of the label decision, the
  calibration error of the reported (calibrated) score.
* ``pairs_en`` / ``pairs_zh``: 80 English and 67 Chinese reference answers, each with evasive,
  off-topic and padded variants, and an incomplete one where the question has two parts.
  Reported per perturbation: pairwise accuracy (score(answer) > score(variant), ties 0.5), tie
  rate, and the mean calibrated score of the reference minus the variant.
* ``wikieval``: the 10 WikiEval dev rows (answer vs poor answer), for continuity with earlier
  figures.

Intervals are 95% percentile bootstraps (2,000 resamples) over rows (pairs: over reference rows;
human: over answers). A word-overlap baseline (share of the question's content words found in the
answer; character bigrams for Chinese) is reported on the same items.

Every scored item is appended to a JSON Lines records file as soon as it is done, keyed by
(config, set, id, candidate), so runs are resumable and reports can be rebuilt without models
(``--records``, default ``benchmarks/results/quality_records.jsonl.gz``: gzip, appended in place)::

    python -m benchmarks.quality --configs default                   # the default on every set
    python -m benchmarks.quality --configs default,ragas,direct --limit 40   # 40 rows per set
    python -m benchmarks.quality --report-only                       # tables from the records

Configs are a method name with optional overrides, ``name:key=value;key=value`` (e.g.
``ragas_raw:method=ragas;noncommittal=all``). Outputs: Markdown tables on stdout and in
``--out-md``, JSON in ``--out``, the reliability plot in ``--plot``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import re
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from relevancy_tracer.config import Settings  # noqa: E402
from relevancy_tracer.scoring.restatement import STOP_WORDS  # noqa: E402
from relevancy_tracer.scoring.calibration import (  # noqa: E402
    auroc,
    balanced_accuracy,
    bootstrap_interval,
    cross_validated,
    expected_calibration_error,
    fit_calibration,
    reliability_table,
)

DATA = Path(os.environ.get("RELEVANCY_TRACER_SHARED", ROOT.parent / "shared")) / "data"
SETS = ("human", "pairs_en", "pairs_zh", "wikieval")
PERTURBATIONS = ("incomplete_answer", "evasive_answer", "off_topic_answer", "padded_answer", "echo_answer", "hedge_answer")
RESULTS = HERE / "results"


# ---------------------------------------------------------------------------------- items


def _hash_order(rows: list[dict], key: Callable[[dict], str]) -> list[dict]:
    return sorted(rows, key=lambda r: hashlib.sha1(key(r).encode("utf-8")).hexdigest())


def _read(name: str) -> list[dict]:
    path = DATA / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_items(sets: Iterable[str], limit: Optional[int] = None) -> list[dict]:
    """Items to score: one per (set, row id, candidate answer).

    ``limit`` takes the first N rows of each set in a fixed hash order (a stable subset for
    iterating); the figures in docs/quality.md use every row.
    """
    items: list[dict] = []
    for name in sets:
        if name == "human":
            rows = _hash_order(_read("relevancy_human_en.jsonl"), lambda r: r["id"])[:limit]
            for r in rows:
                items.append(dict(set=name, id=r["id"], cand="answer", question=r["question"], answer=r["answer"], label=int(r["label"]), subset=r["subset"], origin=r.get("answer_origin")))
        elif name in ("pairs_en", "pairs_zh"):
            rows = _hash_order(_read(f"relevancy_{name}.jsonl"), lambda r: r["id"])[:limit]
            for r in rows:
                for cand in ("answer",) + PERTURBATIONS:
                    if r.get(cand):
                        items.append(dict(set=name, id=r["id"], cand=cand, question=r["question"], answer=r[cand], label=int(cand == "answer"), subset=r["id"].split("-")[1], origin=None))
        elif name == "wikieval":
            rows = _read("wikieval_dev.jsonl")[:limit]
            for i, r in enumerate(rows):
                for cand in ("answer", "poor_answer"):
                    items.append(dict(set=name, id=f"wikieval-{i}", cand=cand, question=r["question"], answer=r[cand], label=int(cand == "answer"), subset="wikieval", origin=None))
        else:
            raise ValueError(f"unknown set {name!r}; sets: {', '.join(SETS)}")
    return items


# ---------------------------------------------------------------------------------- baseline

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_STOP = STOP_WORDS  # the same list as the default's novelty check


def _han_bigrams(text: str) -> set[str]:
    chars = [c for c in text if "\u4e00" <= c <= "\u9fff"]
    return {chars[i] + chars[i + 1] for i in range(len(chars) - 1)}


def term_recall(question: str, answer: str) -> float:
    """Word-overlap baseline: share of the question's content words (Chinese: character bigrams)
    that occur in the answer."""
    if len(_han_bigrams(question)) >= 2:
        wanted = _han_bigrams(question)
        return sum(1 for b in wanted if b in answer) / len(wanted)
    words = {w for w in _WORD.findall(question.lower()) if w not in _STOP and len(w) > 2}
    if not words:
        return 0.0
    present = set(_WORD.findall(answer.lower()))
    return sum(1 for w in words if w in present) / len(words)


# ---------------------------------------------------------------------------------- scoring


def parse_config(text: str) -> tuple[str, dict[str, Any]]:
    """``name`` or ``name:key=value;key=value`` -> (name, overrides). Without ``method=``, the
    name is the method (``default`` means the configured default method)."""
    name, _, rest = text.partition(":")
    overrides: dict[str, Any] = {}
    for part in filter(None, rest.split(";")):
        key, _, value = part.partition("=")
        try:
            overrides[key.strip()] = json.loads(value)
        except ValueError:
            overrides[key.strip()] = value.strip()
    if "method" not in overrides and name != "default":
        overrides["method"] = name
    return name, overrides


def _gunzip_members(data: bytes) -> bytes:
    """The text of concatenated gzip members. A member left unfinished by a killed run keeps the
    complete lines it flushed, and reading goes on at the next member's header (a later run
    appends its members after the unfinished one, which a plain gzip reader stops at)."""
    text = bytearray()
    while data:
        member = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
        out = bytearray()
        pos = 0
        try:
            while pos < len(data) and not member.eof:
                chunk, saved = data[pos : pos + 65536], member.copy()
                try:
                    out += member.decompress(chunk)
                except zlib.error:  # again byte by byte, keeping what came before the break
                    member = saved
                    for i in range(len(chunk)):
                        out += member.decompress(chunk[i : i + 1])
                    raise
                pos += 65536
        except zlib.error:
            pass
        if member.eof:
            text += out
            data = member.unused_data + data[pos:]
            continue
        text += out[: out.rfind(b"\n") + 1]
        following = data.find(b"\x1f\x8b\x08", 1)
        if following < 0:
            break
        data = data[following:]
    return bytes(text)


def read_records(path: Path) -> list[dict]:
    """The records of a JSON Lines file, plain or gzip-compressed (a ``.gz`` name: concatenated
    gzip members, as :func:`append_records` makes them). A run killed while appending leaves an
    unfinished gzip member or a cut last line: what it holds is read, the cut line left out, so
    the next run resumes (:func:`_gunzip_members`). A missing file has no records."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = _gunzip_members(data)
    lines = [line for line in data.decode("utf-8").split("\n") if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # cut off by a killed run
            if i != len(lines) - 1:
                raise
    return records


def append_records(path: Path) -> IO[str]:
    """``path`` opened for appending records, one JSON line each; a ``.gz`` name appends a gzip
    member (flush after each record: a killed run keeps every flushed record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        return gzip.open(path, "at", encoding="utf-8")
    return path.open("a", encoding="utf-8")


def run_config(engine: Any, name: str, overrides: dict, items: list[dict], records_path: Path, concurrency: int, retry_failed: bool = False) -> None:
    """Score every item not yet in the records file with ``engine`` (method overrides applied),
    appending one record per item as it finishes; with ``retry_failed``, also the items whose
    latest record is a failure."""
    import asyncio

    done = {(r["config"], r["set"], r["id"], r["cand"]) for r in latest_records(read_records(records_path)) if not (retry_failed and r.get("status") != "scored")}
    todo = [it for it in items if (name, it["set"], it["id"], it["cand"]) not in done]
    print(f"== {name} {overrides}: {len(todo)} of {len(items)} items to score", flush=True)
    if not todo:
        return
    out = append_records(records_path)
    started = time.perf_counter()
    finished = 0

    async def one(item: dict, limit: asyncio.Semaphore) -> None:
        nonlocal finished
        async with limit:
            t0 = time.perf_counter()
            result = await engine.ascore(item["question"], item["answer"], **overrides)
            seconds = time.perf_counter() - t0
        record = {k: item[k] for k in ("set", "id", "cand", "label", "subset", "origin")}
        record.update(
            config=name,
            status=result.status,
            error=result.error,
            raw=getattr(result, "raw_score", result.score),
            score=result.score,
            label_name=result.label,
            components=result.components,
            generated_questions=result.generated_questions,
            similarities=result.similarities,
            noncommittal=result.noncommittal,
            seconds=seconds,
            llm_calls=result.llm_calls,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            evaluator_version=getattr(result, "evaluator_version", None),
        )
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        finished += 1
        rate = (time.perf_counter() - started) / finished
        print(f"  [{finished}/{len(todo)}] {item['set']:8s} {item['cand']:17s} {result.status:10s} raw={record['raw'] if record['raw'] is None else round(record['raw'], 3)} {seconds:5.1f}s  eta {rate * (len(todo) - finished) / 60:.0f} min", flush=True)

    async def main() -> None:
        limit = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(one(item, limit) for item in todo))

    asyncio.run(main())
    out.close()


# ---------------------------------------------------------------------------------- analysis


def _ci(stat: Callable[[np.ndarray], float], n: int, groups: Optional[list] = None) -> list[float]:
    low, high = bootstrap_interval(stat, n, groups=groups)
    return [round(low, 3), round(high, 3)]


LOW_LABELS = ("does_not_address", "somewhat_related")


def _low_label_share(records: list[Optional[dict]]) -> Optional[float]:
    """Share of ``records`` labelled ``does_not_address`` or ``somewhat_related`` (a failed
    evaluation counts as not low); None when none of them carries a label."""
    labelled = [r for r in records if r is not None and ("label_name" in r and r.get("label_name") is not None or r.get("status") != "scored")]
    if not labelled:
        return None
    return round(sum(1 for r in labelled if r.get("label_name") in LOW_LABELS) / len(labelled), 3)


def pair_report(records: list[dict], value: str = "score") -> dict[str, Any]:
    """Pairwise accuracy (ties 0.5), tie rate and mean reference-minus-variant, per language and
    perturbation, with bootstrap intervals over reference rows."""
    out: dict[str, Any] = {}
    by_key = {(r["set"], r["id"], r["cand"]): r for r in records}
    for lang_set in ("pairs_en", "pairs_zh"):
        refs = sorted({r["id"] for r in records if r["set"] == lang_set and r["cand"] == "answer"})
        if not refs:
            continue
        lang: dict[str, Any] = {}
        for pert in PERTURBATIONS:
            rows = []
            for rid in refs:
                ref, var = by_key.get((lang_set, rid, "answer")), by_key.get((lang_set, rid, pert))
                if ref is None or var is None:
                    continue
                a, b = ref.get(value), var.get(value)
                rows.append((a, b, ref["subset"]))
            if not rows:
                continue

            def wins(idx: np.ndarray, rows: list = rows) -> float:
                vals = []
                for i in idx:
                    a, b, _ = rows[i]
                    if a is None or b is None:
                        vals.append(0.0)  # a failed evaluation counts as a loss
                    else:
                        vals.append(1.0 if a > b else 0.5 if a == b else 0.0)
                return float(np.mean(vals))

            def gap(idx: np.ndarray, rows: list = rows) -> float:
                vals = [rows[i][0] - rows[i][1] for i in idx if rows[i][0] is not None and rows[i][1] is not None]
                return float(np.mean(vals)) if vals else float("nan")

            all_idx = np.arange(len(rows))
            ties = sum(1 for a, b, _ in rows if a is not None and a == b)
            by_source = {}
            for source in sorted({s for _, _, s in rows}):
                idx = np.asarray([i for i, (_, _, s) in enumerate(rows) if s == source])
                by_source[source] = {"n": int(len(idx)), "accuracy": round(wins(idx), 3)}
            lang[pert] = {
                "n": len(rows),
                "accuracy": round(wins(all_idx), 3),
                "accuracy_ci": _ci(wins, len(rows)),
                "tie_rate": round(ties / len(rows), 3),
                "mean_gap": round(gap(all_idx), 3),
                "mean_gap_ci": _ci(gap, len(rows)),
                "by_source": by_source,
                # share of the variants labelled below partially_addresses (labelled records only)
                "low_label_share": _low_label_share([by_key.get((lang_set, rid, pert)) for rid in refs]),
            }
        out[lang_set] = lang
    return out


def human_report(records: list[dict], value: str = "raw", decision: Optional[Callable[[dict], bool]] = None) -> dict[str, Any]:
    """AUROC of ``value`` and balanced accuracy of ``decision(record)`` per subset and pooled."""
    human = [r for r in records if r["set"] == "human"]
    out: dict[str, Any] = {}
    for subset in ("expertqa", "haluquestqa", "pooled"):
        rows = [r for r in human if subset == "pooled" or r["subset"] == subset]
        if len(rows) < 4:
            continue
        # a failed evaluation ranks lowest (it cannot be trusted to say "relevant")
        scores = np.asarray([r[value] if r.get(value) is not None else -1e9 for r in rows], dtype=float)
        labels = np.asarray([r["label"] for r in rows])
        entry: dict[str, Any] = {"n": len(rows), "failures": sum(1 for r in rows if r.get(value) is None)}
        try:
            entry["auroc"] = round(auroc(scores, labels), 3)
            entry["auroc_ci"] = _ci(lambda idx: auroc(scores[idx], labels[idx]), len(rows))
        except ValueError:
            pass
        if decision is not None:
            predicted = np.asarray([bool(decision(r)) for r in rows])
            entry["balanced_accuracy"] = round(balanced_accuracy(predicted, labels), 3)
            entry["balanced_accuracy_ci"] = _ci(lambda idx: balanced_accuracy(predicted[idx], labels[idx]), len(rows))
        out[subset] = entry
    return out


def calibration_report(records: list[dict], kinds: tuple[str, ...] = ("platt", "isotonic")) -> dict[str, Any]:
    """Cross-validated calibration on the human set: each answer's probability comes from a fit
    on the other folds (5 folds). Reports ECE (10 bins) per kind and the reliability table."""
    human = [r for r in records if r["set"] == "human" and r.get("raw") is not None]
    if len(human) < 20:
        return {}
    raw = np.asarray([r["raw"] for r in human], dtype=float)
    labels = np.asarray([r["label"] for r in human])
    out: dict[str, Any] = {}
    for kind in kinds:
        probs = cross_validated(raw, labels, kind)
        out[kind] = {
            "ece": round(expected_calibration_error(probs, labels), 3),
            "ece_ci": _ci(lambda idx: expected_calibration_error(probs[idx], labels[idx]), len(labels)),
            "reliability": reliability_table(probs, labels),
        }
    return out


def speed_report(records: list[dict]) -> dict[str, float]:
    n = len(records)
    if not n:
        return {}
    return {
        "evaluations": n,
        "seconds_per_eval": round(sum(r.get("seconds", 0.0) for r in records) / n, 2),
        "llm_calls_per_eval": round(sum(r.get("llm_calls", 0) for r in records) / n, 2),
        "input_tokens_per_eval": round(sum(r.get("input_tokens", 0) for r in records) / n, 1),
        "output_tokens_per_eval": round(sum(r.get("output_tokens", 0) for r in records) / n, 1),
        "failures": sum(1 for r in records if r.get("status") != "scored"),
    }


def read_as_the_engine(records: list[dict], items: list[dict], calibration_file: Path, config: str) -> list[dict]:
    """``records`` with the score and label the engine would give them under ``calibration_file``
    (:func:`relevancy_tracer.scoring.engine.interpret`: the calibrated probability at the
    calibration's stated prior, the label from the evidence, and the failure-kind rule that
    labels echo, hedge, evasive and off-topic answers ``does_not_address``), the failure kind's
    example similarities from :mod:`benchmarks.refusals`' cache of them."""
    from relevancy_tracer.config import EVIDENCE_THRESHOLDS
    from relevancy_tracer.scoring.engine import interpret
    from relevancy_tracer.scoring.evaluator import load_calibration

    from .refusals import answer_key, refusal_components

    calibration = load_calibration(str(calibration_file))
    answers = {(it["set"], it["id"], it["cand"]): it["answer"] for it in items}
    refusals = refusal_components([answers[(r["set"], r["id"], r["cand"])] for r in records if r.get("raw") is not None], RESULTS / "refusal_similarities.json.gz")
    out = []
    for r in records:
        if r.get("raw") is None:
            out.append(dict(r, config=config))
            continue
        components = dict(r.get("components") or {}, **refusals[answer_key(answers[(r["set"], r["id"], r["cand"])])])
        score, _, _, label, _, kind = interpret(r["raw"], calibration, EVIDENCE_THRESHOLDS, True, None, components, r.get("similarities") or [], r.get("noncommittal") or [])
        out.append(dict(r, config=config, score=score, label_name=label, failure_kind=kind))
    return out


#: Model-free baselines reported beside every method.
BASELINES = ("word_overlap", "answer_length")


def baseline_records(items: list[dict], config: str = "word_overlap") -> list[dict]:
    """Records of a model-free baseline for the same items: ``word_overlap`` (raw = score = term
    recall) or ``answer_length`` (raw = score = 1 - exp(-characters / 1000), increasing in the
    answer's length: only its ranking matters)."""
    out = []
    for it in items:
        value = term_recall(it["question"], it["answer"]) if config == "word_overlap" else 1.0 - math.exp(-len(it["answer"]) / 1000.0)
        out.append({k: it[k] for k in ("set", "id", "cand", "label", "subset", "origin")} | {"config": config, "status": "scored", "raw": value, "score": value})
    return out


#: Methods whose score is a fixed function of component scores (``combined``, the multi-method article's weights, and the
#: earlier default), derived from a ``components`` pass instead of being rerun.
SEED_WEIGHTS = {"ragas": 0.3, "direct": 0.25, "decomposition": 0.25, "intent": 0.2}
DERIVED = {
    "ragas": {"ragas": 1.0},
    "direct": {"direct": 1.0},
    "decomposition": {"decomposition": 1.0},
    "intent": {"intent": 1.0},
    "llm_similarity": {"llm_similarity": 1.0},
    "combined": SEED_WEIGHTS,
    "ragas_intent": {"ragas": 0.2, "intent": 0.8},
}


def derive(records: list[dict], weights: dict[str, float], name: str) -> list[dict]:
    """Records of a method computed from a components pass: the weighted mean of the component
    scores that succeeded (as ``methods.weighted`` does), raw and uncalibrated."""
    out = []
    for r in records:
        parts = {k: r.get("components", {}).get(k) for k in weights}
        ok = {k: v for k, v in parts.items() if v is not None}
        total = sum(weights[k] for k in ok)
        value = sum(weights[k] * v for k, v in ok.items()) / total if total else None
        out.append(dict(r, config=name, raw=value, score=value, label_name=None, status="scored" if value is not None else "failed"))
    return out


def residual_components(records: list[dict], items: list[dict]) -> list[dict]:
    """Records of ``ragas_judge`` with the components of the residual check computed afresh from
    their texts: ``residual_similarity`` (the local embedder's cosine of the question and
    :func:`~relevancy_tracer.scoring.restatement.residual`; the same model the method sends it
    to) and ``novelty``; records from before the check get ``answer_similarity`` from their old
    ``topicality``. No chat model call: the judge and RAGAS components are the stored ones, so a
    change of the residual rule needs no rerun."""
    from relevancy_tracer.models.local_embed import make_local_embedder
    from relevancy_tracer.scoring.restatement import novelty, residual

    texts = {(it["set"], it["id"], it["cand"]): (it["question"], it["answer"]) for it in items}
    todo = [r for r in records if (r.get("components") or {}).get("judge") is not None and (r["set"], r["id"], r["cand"]) in texts]
    if not todo:
        return records
    pairs = [(texts[(r["set"], r["id"], r["cand"])], residual(*texts[(r["set"], r["id"], r["cand"])])) for r in todo]
    embedder = make_local_embedder("use-multilingual-v3")
    flat = [t for (question, _), rest in pairs for t in (question, rest or ".")]
    vectors = np.concatenate([np.asarray(embedder.embed_sync(flat[i : i + 64]), dtype=np.float64) for i in range(0, len(flat), 64)])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    done = {}
    for k, (r, ((question, answer), rest)) in enumerate(zip(todo, pairs)):
        c = dict(r["components"])
        if "answer_similarity" not in c:
            c["answer_similarity"] = c["topicality"]
        c["residual_similarity"] = float(vectors[2 * k] @ vectors[2 * k + 1]) if rest else 0.0
        c["novelty"] = novelty(question, answer)
        done[id(r)] = dict(r, components=c)
    return [done.get(id(r), r) for r in records]


def recompute_ragas_judge(records: list[dict], items: Optional[list[dict]] = None) -> list[dict]:
    """Records of ``ragas_judge`` with ``raw`` recomputed from their components by the current
    :func:`~relevancy_tracer.scoring.methods.ragas_judge_raw` (a change of the combination needs
    no new model calls: the components are the same calls' outputs; with ``items``, records from
    before the residual check are completed by :func:`residual_components`). ``score`` = raw;
    ``label_name`` is dropped (report labels with ``--calibration-file``)."""
    from relevancy_tracer.scoring.methods import ragas_judge_raw, ragas_judge_topical

    if items is not None:
        records = residual_components(records, items)
    out = []
    for r in records:
        c = r.get("components") or {}
        parts = [c.get(k) for k in ("answer_similarity", "ragas", "residual_similarity", "novelty")]
        if r.get("raw") is not None and c.get("judge") is not None and all(v is not None for v in parts):
            raw = ragas_judge_raw(c["judge"], *parts)
            # the stored label came from the old raw score: labels need the calibration fitted for the new one
            r = dict(r, raw=raw, score=raw, label_name=None, components=dict(c, topicality=ragas_judge_topical(*parts)))
        out.append(r)
    return out


def latest_records(records: list[dict]) -> list[dict]:
    """The last record of each (config, set, id, candidate): a rerun replaces the earlier one."""
    latest: dict[tuple, dict] = {}
    for r in records:
        latest[(r["config"], r["set"], r["id"], r["cand"])] = r
    return list(latest.values())


def from_parts(records: list[dict], items: list[dict]) -> dict[str, list[dict]]:
    """Records of ``ragas_judge_intent`` (the default) and ``ragas_intent`` (the previous
    default) computed from the records of ``ragas_judge`` and ``intent``: the same requests,
    with the same prompts and decoding. ``ragas_judge`` records hold the question conversation
    (questions, judge turn), the embeddings of the question, the generated questions and the
    answer (``ragas``, ``answer_similarity``) and ``novelty`` (computed from the texts), and
    ``intent`` records the intent statement and fulfilment judgement. No model call. A record of
    a real ``ragas_judge_intent`` run for the same item replaces the derived one.

    Returns ``{"ragas_judge_intent": [...], "ragas_intent": [...]}``; records are marked
    ``"derived_from"`` and carry ``seconds``/``llm_calls`` of neither.
    """
    from relevancy_tracer.scoring.methods import RAGAS_INTENT_WEIGHTS, ragas_judge_intent_raw, ragas_judge_intent_topical
    from relevancy_tracer.scoring.restatement import novelty

    latest = latest_records(records)
    judge = {(r["set"], r["id"], r["cand"]): r for r in latest if r["config"] == "ragas_judge" and r.get("status") == "scored"}
    intent = {(r["set"], r["id"], r["cand"]): r for r in latest if r["config"] == "intent"}
    real = {(r["set"], r["id"], r["cand"]): r for r in latest if r["config"] == "ragas_judge_intent"}
    texts = {(it["set"], it["id"], it["cand"]): (it["question"], it["answer"]) for it in items}
    out: dict[str, list[dict]] = {"ragas_judge_intent": [], "ragas_intent": []}
    weights = dict(RAGAS_INTENT_WEIGHTS)
    for key, rj in judge.items():
        if key not in intent or key not in texts:
            continue
        it = intent[key]
        c = rj.get("components") or {}
        base = {k: v for k, v in rj.items() if k not in ("seconds", "llm_calls", "input_tokens", "output_tokens", "evaluator_version")}
        if it.get("status") != "scored" or it.get("raw") is None:
            for name in out:
                out[name].append(dict(base, config=name, status=it.get("status"), error=it.get("error"), raw=None, score=None, label_name=None, components={}, derived_from=["ragas_judge", "intent"]))
            continue
        new = novelty(*texts[key])
        asim = c.get("answer_similarity", c.get("topicality"))  # records from before the restatement check
        raw = ragas_judge_intent_raw({"judge": c["judge"], "intent": it["raw"]}, asim, c["ragas"], new)
        components = {"judge": c["judge"], "intent": it["raw"], "topicality": ragas_judge_intent_topical(asim, c["ragas"], new), "ragas": c["ragas"], "answer_similarity": asim, "novelty": new}
        if key not in real:
            out["ragas_judge_intent"].append(dict(base, config="ragas_judge_intent", raw=raw, score=raw, label_name=None, components=components, intent=it.get("intent"), derived_from=["ragas_judge", "intent"]))
        previous = (weights["ragas"] * c["ragas"] + weights["intent"] * it["raw"]) / (weights["ragas"] + weights["intent"])
        out["ragas_intent"].append(dict(base, config="ragas_intent", raw=previous, score=previous, label_name=None, components={"ragas": c["ragas"], "intent": it["raw"]}, derived_from=["ragas_judge", "intent"]))
    out["ragas_judge_intent"].extend(r for r in real.values())
    return out


def with_calibration(records: list[dict], kind: str = "platt") -> list[dict]:
    """``score`` = the raw score mapped by a calibration fitted on the human set of these
    records (out of sample for the pair sets; the human-set ECE is cross-validated separately)."""
    human = [r for r in records if r["set"] == "human" and r.get("raw") is not None]
    if len(human) < 20:
        return records
    calibration = fit_calibration([r["raw"] for r in human], [r["label"] for r in human], kind)
    return [dict(r, score=float(calibration(r["raw"])) if r.get("raw") is not None else None) for r in records]


def config_report(records: list[dict], relevant_labels: tuple[str, ...] = ("directly_addresses",)) -> dict[str, Any]:
    """Every measure for one config's records."""
    return {
        "human": human_report(records, "raw", decision=lambda r: r.get("label_name") in relevant_labels if "label_name" in r else None),
        "pairs": pair_report(records, "score"),
        "calibration": calibration_report(records),
        "speed": speed_report([r for r in records if "seconds" in r]),
    }


# ---------------------------------------------------------------------------------- tables


def _fmt(value: Any, ci: Optional[list] = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{text} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else text


def markdown(reports: dict[str, dict]) -> str:
    lines = ["#### Human judgements (relevancy_human_en): AUROC of the raw score, balanced accuracy of the label", ""]
    lines.append("| config | ExpertQA AUROC | HaluQuestQA AUROC | pooled AUROC | label balanced accuracy (pooled) |")
    lines.append("| --- | --- | --- | --- | --- |")
    for name, rep in reports.items():
        h = rep.get("human", {})
        cells = [_fmt(h.get(s, {}).get("auroc"), h.get(s, {}).get("auroc_ci")) for s in ("expertqa", "haluquestqa", "pooled")]
        pooled = h.get("pooled", {})
        cells.append(_fmt(pooled.get("balanced_accuracy"), pooled.get("balanced_accuracy_ci")))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for lang in ("pairs_en", "pairs_zh"):
        lines += ["", f"#### Pairs ({lang}): pairwise accuracy, ties 0.5 [95% CI]; mean score gap reference - variant", ""]
        kinds = [k.replace("_answer", "").replace("_", "-") for k in PERTURBATIONS]
        lines.append("| config | " + " | ".join(kinds + [f"gap {k}" for k in kinds]) + " |")
        lines.append("|" + " --- |" * (1 + 2 * len(kinds)))
        for name, rep in reports.items():
            p = rep.get("pairs", {}).get(lang, {})
            if not p:
                continue
            acc = [_fmt(p.get(k, {}).get("accuracy"), p.get(k, {}).get("accuracy_ci")) for k in PERTURBATIONS]
            gaps = [_fmt(p.get(k, {}).get("mean_gap")) for k in PERTURBATIONS]
            lines.append(f"| {name} | " + " | ".join(acc + gaps) + " |")
    lines += ["", "#### Degraded answers labelled `does_not_address` or `somewhat_related` (share of rows)", ""]
    lines.append("| config | " + " | ".join(f"{lang[6:]} {k.replace('_answer', '').replace('_', '-')}" for lang in ("pairs_en", "pairs_zh") for k in PERTURBATIONS) + " |")
    lines.append("|" + " --- |" * (1 + 2 * len(PERTURBATIONS)))
    for name, rep in reports.items():
        cells = [_fmt(rep.get("pairs", {}).get(lang, {}).get(k, {}).get("low_label_share")) for lang in ("pairs_en", "pairs_zh") for k in PERTURBATIONS]
        if any(c != "-" for c in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "#### Calibration on the human set (5-fold cross-validated fit): expected calibration error", ""]
    lines.append("| config | Platt ECE | isotonic ECE |")
    lines.append("| --- | --- | --- |")
    for name, rep in reports.items():
        c = rep.get("calibration", {})
        if c:
            lines.append(f"| {name} | {_fmt(c.get('platt', {}).get('ece'), c.get('platt', {}).get('ece_ci'))} | {_fmt(c.get('isotonic', {}).get('ece'), c.get('isotonic', {}).get('ece_ci'))} |")
    lines += ["", "#### Cost per evaluation", ""]
    lines.append("| config | evaluations | s/eval | LLM calls/eval | tokens in / out | failures |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for name, rep in reports.items():
        s = rep.get("speed", {})
        if s:
            lines.append(f"| {name} | {s['evaluations']} | {s['seconds_per_eval']:.2f} | {s['llm_calls_per_eval']:.2f} | {s['input_tokens_per_eval']:.0f} / {s['output_tokens_per_eval']:.0f} | {s['failures']} |")
    return "\n".join(lines)


def reliability_plot(records: list[dict], path: Path, title: str) -> None:
    """The reliability curve of the reported score on the human set (and the pair sets), as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 5.0), dpi=120)
    ax.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1, label="perfect calibration")
    for subset, colour in (("human", "#1f77b4"), ("pairs", "#d62728")):
        rows = [r for r in records if (r["set"] == "human") == (subset == "human") and r.get("score") is not None and r["set"] != "wikieval"]
        if not rows:
            continue
        table = reliability_table([r["score"] for r in rows], [r["label"] for r in rows])
        xs = [t["mean_probability"] for t in table]
        ys = [t["observed"] for t in table]
        sizes = [12 + 2 * t["count"] for t in table]
        ece = expected_calibration_error([r["score"] for r in rows], [r["label"] for r in rows])
        name = "human judgements" if subset == "human" else "contrastive pairs"
        ax.plot(xs, ys, color=colour, marker="o", linewidth=1.5, label=f"{name} (n={len(rows)}, ECE {ece:.3f})")
        ax.scatter(xs, ys, s=sizes, color=colour, alpha=0.35)
    ax.set_xlabel("reported relevancy score (calibrated probability)")
    ax.set_ylabel("share of answers a person judged relevant")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="default", help="comma-separated configs (method names, or name:key=value;...)")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--limit", type=int, default=None, help="first N rows of each set (fixed hash order)")
    parser.add_argument("--records", type=Path, default=RESULTS / "quality_records.jsonl.gz", help="JSON Lines records, resumed and appended to (gzip when the name ends in .gz)")
    parser.add_argument("--report-only", action="store_true", help="no scoring: tables from the records file")
    parser.add_argument("--concurrency", type=int, default=Settings.concurrency, help=f"evaluations in flight (default {Settings.concurrency}, the library's)")
    parser.add_argument("--llm", default="local")
    parser.add_argument("--embeddings", default="local")
    parser.add_argument("--out", type=Path, default=RESULTS / "quality.json")
    parser.add_argument("--out-md", type=Path, default=RESULTS / "quality.md")
    parser.add_argument("--plot", type=Path, default=RESULTS / "calibration.png")
    parser.add_argument("--calibration-file", type=Path, default=None, help="also report each config with its raw score mapped by this calibration (labels from the calibrated thresholds)")
    parser.add_argument("--recompute-raw", action="store_true", help="ragas_judge records: raw recomputed from the stored components by the current combination")
    parser.add_argument("--from-parts", action="store_true", help="also report ragas_judge_intent (the default) and ragas_intent (the previous default) computed from the ragas_judge and intent records (benchmarks.quality.from_parts; no model call)")
    parser.add_argument("--retry-failed", action="store_true", help="score again the items whose record is a failure (e.g. after a decoding fix); the new record replaces it")
    parser.add_argument("--components", default="", help="comma-separated component names reported alone, derived from the configs' records (e.g. ragas,judge)")
    args = parser.parse_args(argv)

    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    items = load_items(sets, args.limit)
    configs = [parse_config(c.strip()) for c in args.configs.split(",") if c.strip()]
    if not args.report_only:
        from relevancy_tracer.scoring.engine import Engine

        engine = Engine(Settings.resolve(llm=args.llm, embeddings=args.embeddings))
        print(f"models: {engine.models.llm.name} + {engine.models.embedder.name}; {len(items)} items", flush=True)
        engine.score("Warm-up question?", "Warm-up answer.")  # load the models outside the timings
        for name, overrides in configs:
            run_config(engine, name, overrides, items, args.records, args.concurrency, retry_failed=args.retry_failed)

    wanted = {(it["set"], it["id"], it["cand"]) for it in items}
    by_config: dict[str, list[dict]] = defaultdict(list)
    for record in latest_records(read_records(args.records)):
        if (record["set"], record["id"], record["cand"]) in wanted:
            by_config[record["config"]].append(record)
    if args.recompute_raw:
        for name in list(by_config):
            by_config[name] = recompute_ragas_judge(by_config[name], items)
    if args.from_parts:
        derived = from_parts([r for records in by_config.values() for r in records], items)
        for name, records in derived.items():
            if records:
                by_config[name] = records
                if not args.report_only and name not in [n for n, _ in configs]:
                    configs.append((name, {}))
    scored = {(r["set"], r["id"], r["cand"]) for records in by_config.values() for r in records}
    for baseline in BASELINES:
        by_config[baseline] = baseline_records([it for it in items if (it["set"], it["id"], it["cand"]) in scored], baseline)
    names = [n for n, _ in configs if n in by_config] if not args.report_only else sorted(by_config)
    for name in [n for n in names if n not in BASELINES]:
        for component in filter(None, args.components.split(",")):
            if not any(component in (r.get("components") or {}) for r in by_config[name]):
                continue
            derived = f"{component} (component of {name})"
            by_config[derived] = derive(by_config[name], {component: 1.0}, derived)
            names.append(derived)
        if args.calibration_file is not None:
            calibrated = f"{name} calibrated"
            by_config[calibrated] = read_as_the_engine(by_config[name], items, args.calibration_file, calibrated)
            names.insert(0, calibrated)
    names += [b for b in BASELINES if b not in names]
    reports = {name: config_report(by_config[name]) for name in names}
    table = markdown(reports)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sets": sets, "limit": args.limit, "reports": reports}, indent=1, default=str), encoding="utf-8")
    args.out_md.write_text(table + "\n", encoding="utf-8")
    first = next((n for n in names if n.endswith(" calibrated")), None) or next((n for n in names if n not in BASELINES), None)
    if first is not None and any(r.get("score") is not None for r in by_config[first]):
        reliability_plot(by_config[first], args.plot, f"{first}: reliability on the development sets")
    print(f"\nwritten: {args.out}, {args.out_md}, {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
