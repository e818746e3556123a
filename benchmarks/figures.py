"""The benchmark figures of the documentation, rendered from ``benchmarks/results/*.json``.

Every number in README.md, docs/*.md and benchmarks/README.md that a benchmark produced sits
between marker comments (invisible on the site and on GitHub) and is rewritten from the results
file that holds it, so a rerun of a benchmark updates the docs and a stale figure fails
``tests/test_figures.py``::

    python -m benchmarks.figures --check          # exit 1 when a figure differs from its results file
    python -m benchmarks.figures --write          # rewrite every figure (after a benchmark's rerun)

Markers (the spec is split like a shell line, so a key with spaces is quoted):

* a figure: ``<!-- fig FILE:KEY.PATH [FORMAT] [ci] -->0.028 [0.022, 0.052]<!-- /fig -->``.
  ``FILE`` is a results file's stem (``production_mix`` for ``benchmarks/results/production_mix.json``;
  ``.json.gz`` too; a path from the repository root for the shipped calibrations that
  ``benchmarks.fit_calibration`` writes), ``KEY.PATH`` the keys (or list indices) into it, joined by dots.
  ``FORMAT`` is a Python format spec (``.2f``, ``.0%``, ``,``; default ``str(value)``); ``ci``
  appends `` [low, high]`` from the sibling key ``<last key>_ci`` (or ``ci``) in the same format.
  A figure never starts a line: Markdown would read the comment as an HTML block.
* a derived figure: ``<!-- fig =NAME [FORMAT] -->2.0<!-- /fig -->`` or ``=NAME(ARG,ARG)``:
  :data:`DERIVED`'s function ``NAME`` (a ratio of two results, a mean over a file's rows)
  computes it from the results (and the arguments, as strings).
* a table: ``<!-- fig-table NAME -->`` (or ``NAME(ARG,ARG)``) and ``<!-- /fig-table -->`` on
  lines of their own, around a Markdown table rendered whole by :data:`TABLES`' function ``NAME``.
* a block: ``<!-- fig-block FILE:KEY.PATH [LANG] -->`` and ``<!-- /fig-block -->`` on lines of
  their own, around a fenced code block holding the value whole: a string as it is (``LANG``
  default ``text``), anything else as JSON indented by 1 (default ``json``). The example outputs
  of ``benchmarks.examples`` (what a command printed) are shown this way.

Each figure's page section (between level-1 or level-2 headings), or the page's introduction,
must name the benchmark that made its results file (``benchmarks.NAME`` or ``benchmarks/NAME.py``, see
:func:`module_of`): the docs state current figures with the command that made them.

A development tool, not part of the wheel (which holds only ``relevancy_tracer``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ._paths import ROOT

RESULTS = ROOT / "benchmarks" / "results"

def default_pages(root: Path = ROOT) -> list[Path]:
    """The pages whose figures are rendered: README.md, benchmarks/README.md and every page of
    docs/ under ``root`` (docs/design-notes.md is history and holds no marker)."""
    return [root / "README.md", root / "benchmarks" / "README.md", *sorted((root / "docs").glob("*.md"))]


class FigureError(Exception):
    """A marker that cannot be rendered: an unknown results file, key, derivation or table."""


#: a marker quoted in inline code (after a backtick) is an example, not a figure
FIG = re.compile(r"(?<!`)<!-- fig (?P<spec>.+?) -->(?P<text>.*?)<!-- /fig -->", re.S)
#: a block's opening marker stands alone on its line (checked in :func:`render`)
BLOCK = re.compile(r"(?<!`)(?P<head><!-- fig-block (?P<spec>[^\n]+?) -->\n)(?P<body>.*?)(?P<tail><!-- /fig-block -->)", re.S)
TABLE = re.compile(r"(?P<head><!-- fig-table (?P<name>[\w.-]+)(?:\((?P<args>[^()]*)\))? -->\n)(?P<body>.*?)(?P<tail><!-- /fig-table -->)", re.S)

#: results stems whose benchmark module is not their name's prefix
MODULE_OVERRIDES = {"calibration": "fit_calibration", "refusal_similarities": "production_mix", "chat_alerts": "alert_traffic"}
#: results stems made by ``benchmarks.examples`` (``example_score``, ``example_demo``)
EXAMPLES_PREFIX = "example_"


def module_of(stem: str) -> str:
    """The benchmark module that writes ``benchmarks/results/<stem>.json``: the longest module of
    benchmarks/ whose name starts the stem (``speed_repack_on`` -> ``speed``), or an override."""
    if stem in MODULE_OVERRIDES:
        return MODULE_OVERRIDES[stem]
    if stem.startswith("relevancy_tracer/calibrations/"):
        return "fit_calibration"
    if stem.startswith(EXAMPLES_PREFIX):
        return "examples"
    modules = sorted((p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")), key=len, reverse=True)
    for module in modules:
        if stem == module or stem.startswith(module + "_"):
            return module
    raise FigureError(f"no benchmark module writes results file {stem!r}")


class Results:
    """The results files, loaded once each; records which stems a rendering used."""

    def __init__(self, directory: Path = RESULTS) -> None:
        self.directory = directory
        self._cache: dict[str, Any] = {}
        self.used: set[str] = set()

    def __call__(self, stem: str) -> Any:
        """The parsed content of ``<stem>.json`` (or ``.json.gz``; ``.jsonl.gz``: a list of rows)."""
        self.used.add(stem)
        if stem not in self._cache:
            directory = ROOT if "/" in stem else self.directory
            for suffix in (".json", ".json.gz", ".jsonl.gz"):
                path = directory / (stem + suffix)
                if path.exists():
                    opener = gzip.open if suffix.endswith(".gz") else open
                    with opener(path, "rt", encoding="utf-8") as handle:
                        self._cache[stem] = [json.loads(line) for line in handle if line.strip()] if suffix == ".jsonl.gz" else json.load(handle)
                    break
            else:
                raise FigureError(f"no results file benchmarks/results/{stem}.json")
        return self._cache[stem]

    def get(self, ref: str) -> Any:
        """The value at ``FILE:KEY.PATH``; raises FigureError naming the first missing key."""
        stem, sep, path = ref.partition(":")
        if not sep or not path:
            raise FigureError(f"{ref!r}: a figure is FILE:KEY.PATH")
        value = self(stem)
        walked = []
        for key in path.split("."):
            walked.append(key)
            if isinstance(value, list) and re.fullmatch(r"-?\d+", key) and -len(value) <= int(key) < len(value):
                value = value[int(key)]
            elif isinstance(value, dict) and key in value:
                value = value[key]
            else:
                raise FigureError(f"{stem}.json has no {'.'.join(walked)}")
        return value

    def ci(self, ref: str) -> list:
        """The interval beside ``FILE:KEY.PATH``: key ``<last>_ci``, else ``ci`` in the same object."""
        head, _, last = ref.rpartition(".")
        for candidate in (f"{head}.{last}_ci" if head else f"{ref}_ci", f"{head}.ci" if head else None):
            if candidate:
                try:
                    return self.get(candidate)
                except FigureError:
                    pass
        raise FigureError(f"{ref!r} has no interval ({last}_ci or ci beside it)")


#: what a derivation or table raises on results it cannot read (reported as a FigureError)
DERIVATION_ERRORS = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError)


def fmt(value: Any, spec: str = "") -> str:
    """``value`` in the Python format ``spec``; no spec: ``str(value)`` (JSON's own digits)."""
    if value is None:
        return "-"
    if not spec:
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError) as exc:
        raise FigureError(f"cannot format {value!r} as {spec!r}: {exc}") from None


def with_ci(value: Any, ci: Iterable[Any], spec: str) -> str:
    """``value [low, high]`` in one format."""
    low, high = ci
    return f"{fmt(value, spec)} [{fmt(low, spec)}, {fmt(high, spec)}]"


def render_figure(spec: str, results: Results) -> str:
    """The text of one inline marker's spec (see the module docstring)."""
    try:
        tokens = shlex.split(spec)
    except ValueError as exc:
        raise FigureError(f"{spec!r}: {exc}") from None
    if not tokens:
        raise FigureError("an empty figure marker")
    source, options = tokens[0], tokens[1:]
    show_ci = "ci" in options
    formats = [o for o in options if o != "ci"]
    if len(formats) > 1:
        raise FigureError(f"{spec!r}: more than one format")
    spec_format = formats[0] if formats else ""
    if source.startswith("="):
        call = re.fullmatch(r"=(?P<name>[\w.-]+)(?:\((?P<args>[^()]*)\))?", source)
        name = call["name"] if call else source[1:]
        if not call or name not in DERIVED:
            raise FigureError(f"no derived figure {name!r} in benchmarks/figures.py")
        args = [a.strip() for a in call["args"].split(",")] if call["args"] else []
        try:
            value = DERIVED[name](results, *args)
        except DERIVATION_ERRORS as exc:  # a key missing from a results file, a wrong argument
            raise FigureError(f"{source!r}: {type(exc).__name__}: {exc}") from None
        if show_ci:
            value, interval = value
            return with_ci(value, interval, spec_format)
        return value if isinstance(value, str) else fmt(value, spec_format)
    value = results.get(source)
    return with_ci(value, results.ci(source), spec_format) if show_ci else fmt(value, spec_format)


def render_block(spec: str, results: Results) -> str:
    """The fenced code block of one block marker's spec (see the module docstring), ending
    with a newline. The fence is longer than any run of backticks in the value."""
    try:
        tokens = shlex.split(spec)
    except ValueError as exc:
        raise FigureError(f"{spec!r}: {exc}") from None
    if not 1 <= len(tokens) <= 2 or tokens[0].startswith("="):
        raise FigureError(f"{spec!r}: a block is FILE:KEY.PATH [LANG]")
    value = results.get(tokens[0])
    if isinstance(value, str):
        content, language = value.rstrip("\n"), "text"
    else:
        content, language = json.dumps(value, indent=1, ensure_ascii=False), "json"
    language = tokens[1] if len(tokens) == 2 else language
    fence = "```"
    while fence in content:
        fence += "`"
    return f"{fence}{language}\n{content}\n{fence}\n"


def _sections(text: str) -> list[tuple[int, int]]:
    """(start, end) of the page's sections: split at level-1 and level-2 headings outside fenced
    code blocks."""
    starts, fenced, position = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,2} ", line):
            starts.append(position)
        position += len(line)
    bounds = [0, *[p for p in starts if p > 0], len(text)]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _section_text(text: str, position: int) -> str:
    """The section holding ``position``, with the page's introduction (its first section, where
    the page's commands usually are)."""
    sections = _sections(text)
    start, end = next((s for s in sections if s[0] <= position < s[1]), sections[-1])
    intro = text[sections[0][0]:sections[0][1]]
    return intro + text[start:end]


def _names_benchmark(section: str, module: str) -> bool:
    return f"benchmarks.{module}" in section or f"benchmarks/{module}.py" in section


def render(text: str, results: Optional[Results] = None, where: str = "<text>") -> str:
    """``text`` with every figure and table marker's content rendered from the results.

    Raises FigureError for a marker that cannot be rendered, or whose section does not name the
    benchmark that made its results file."""
    results = results or Results()
    problems: list[str] = []

    def check_command(position: int, label: str, used: set[str]) -> None:
        section = _section_text(text, position)
        for stem in sorted(used):
            module = module_of(stem)
            if not _names_benchmark(section, module):
                line = text.count("\n", 0, position) + 1
                problems.append(f"{where}:{line}: {label} comes from benchmarks/results/{stem}.json, but its section does not name benchmarks.{module} (the command that made it)")

    def table(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise FigureError(f"{where}: no table {name!r} in benchmarks/figures.py")
        results.used = set()
        args = [a.strip() for a in match["args"].split(",")] if match["args"] else []
        try:
            body = TABLES[name](results, *args).rstrip("\n") + "\n"
        except DERIVATION_ERRORS as exc:  # a key missing from a results file, a wrong argument
            line = text.count("\n", 0, match.start()) + 1
            raise FigureError(f"{where}:{line}: table {name}: {type(exc).__name__}: {exc}") from None
        check_command(match.start(), f"table {name}", results.used)
        return match["head"] + body + match["tail"]

    def block(match: re.Match) -> str:
        line = text.count("\n", 0, match.start()) + 1
        if text[text.rfind("\n", 0, match.start()) + 1:match.start()].strip():
            raise FigureError(f"{where}:{line}: a fig-block marker stands on a line of its own")
        results.used = set()
        try:
            body = render_block(match["spec"], results)
        except FigureError as exc:
            raise FigureError(f"{where}:{line}: {exc}") from None
        check_command(match.start(), f"block {match['spec']!r}", results.used)
        return match["head"] + body + match["tail"]

    blocks: list[tuple[int, int]] = []

    def figure(match: re.Match) -> str:
        if any(start <= match.start() < end for start, end in blocks):  # a block's text, not a figure
            return match.group(0)
        line_start = text.rfind("\n", 0, match.start()) + 1
        if not re.sub(r"^\s*([-*+]|\d+\.)?\s*", "", text[line_start:match.start()]):
            line = text.count("\n", 0, match.start()) + 1
            raise FigureError(f"{where}:{line}: a figure starts its line, where Markdown reads the comment as an HTML block and breaks the paragraph: put a word before it")
        results.used = set()
        try:
            rendered = render_figure(match["spec"], results)
        except FigureError as exc:
            line = text.count("\n", 0, match.start()) + 1
            raise FigureError(f"{where}:{line}: {exc}") from None
        check_command(match.start(), f"figure {match['spec']!r}", results.used)
        return f"<!-- fig {match['spec']} -->{rendered}<!-- /fig -->"

    out = BLOCK.sub(block, text)
    text = out
    out = TABLE.sub(table, text)
    text = out
    blocks[:] = [m.span("body") for m in BLOCK.finditer(text)]
    out = FIG.sub(figure, out)
    if problems:
        raise FigureError("\n".join(problems))
    return out


# --------------------------------------------------------------------------------------------
# Derived figures and tables. Each takes the Results and returns a value (formatted by the
# marker's format) or a string; a table returns Markdown.


DERIVED: dict[str, Callable[[Results], Any]] = {}
TABLES: dict[str, Callable[[Results], str]] = {}


def derived(name: str) -> Callable:
    """Register a derived figure under ``name``."""
    def register(fn: Callable) -> Callable:
        DERIVED[name] = fn
        return fn
    return register


def table(name: str) -> Callable:
    """Register a table renderer under ``name``."""
    def register(fn: Callable) -> Callable:
        TABLES[name] = fn
        return fn
    return register


def md_table(header: list[str], rows: list[list[str]], align: Optional[list[str]] = None) -> str:
    """A Markdown table; ``align`` per column: ``---`` or ``---:``."""
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += [("| " + " | ".join(row) + " |").replace("|  |", "| |").replace("|  |", "| |") for row in rows]
    return "\n".join(lines)


# ==== the docs' derivations and tables (one section per page) ===============================


# ---- docs/methods.md: benchmarks/results/multiturn.json (python -m benchmarks.multiturn)

MULTITURN_CONFIGS = {
    "last_turn": "the last turn alone (before)",
    "history": "**in its conversation (now)**",
    "rewrite": "the benchmark's own rewrite, no history",
}


@table("multiturn")
def _multiturn(r: Results, stem: str = "multiturn") -> str:
    header = ["question judged", "turns", "right answer: mean score", "right answer `does_not_address`", "right answer outscores the earlier turn's answer"]
    rows = []
    reports = r(stem)["reports"]
    for config, label in MULTITURN_CONFIGS.items():
        for group in ("all", "self_contained", "context_dependent"):
            cell = reports.get(config, {}).get(group)
            if not cell:
                continue
            rows.append(
                [
                    label if group == "all" else "",
                    f"{group.replace('_', '-')} ({cell['turns']})",
                    with_ci(cell["right_mean_score"], cell["right_mean_score_ci"], ".2f"),
                    f"{cell['right_does_not_address_count']} of {cell['turns']} ({fmt(cell['right_does_not_address'], '.0%')})",
                    with_ci(cell["pairwise"], cell["pairwise_ci"], ".2f") if "pairwise" in cell else "not measured",
                ]
            )
    return md_table(header, rows)


# ---- docs/methods.md: benchmarks/results/chat_alerts.json (python -m benchmarks.alert_traffic)


@table("chat_alerts")
def _chat_alerts(r: Results, stem: str = "chat_alerts") -> str:
    data = r(stem)
    by = {(run["follow_up_share"], run["follow_ups_judged"]): run for run in data["runs"]}
    header = ["follow-up turns", "healthy answers labelled low (in conversation)", "days `RelevancyLowLabelShareHigh` fired: in conversation", "last turn alone"]
    rows = []
    for share in sorted({share for share, _ in by}):
        history = by.get((share, "history"))
        last = by.get((share, "last_turn")) or (history if share == 0 else None)
        cell = lambda run: "not measured" if run is None else f"{run['fired'].get('RelevancyLowLabelShareHigh', 0)} of {run['days']}"  # noqa: E731
        rows.append([fmt(share, ".0%"), fmt(history["low_label_share"], ".0%") if history else "not measured", cell(history), cell(last)])
    return md_table(header, rows)


# ---- docs/quality.md: benchmarks/results/quality.json (python -m benchmarks.quality --report-only ...)

DEFAULT_CALIBRATED = "ragas_judge_intent calibrated"
#: quality.json report name -> the row label of the quality page's tables
QUALITY_ROWS = [
    ("ragas_intent", "`ragas_intent` (the default before `ragas_judge`)"),
    ("ragas_judge", "`ragas_judge` (the previous default)"),
    ("intent", "`intent` alone"),
    ("judge (component of ragas_judge_intent)", "`judge` component"),
    ("topicality (component of ragas_judge_intent)", "`topicality` component"),
    ("word_overlap", "word overlap"),
    ("answer_length", "answer length"),
]
PAIR_KINDS = ["incomplete", "evasive", "off_topic", "padded", "echo", "hedge"]


def _report(r: Results, config: str) -> dict:
    return r.get(f"quality:reports.{config}")


def _acc(cell: dict) -> str:
    return with_ci(cell["accuracy"], cell["accuracy_ci"], ".2f")


@derived("quality.human_label_balanced_accuracy")
def _human_label_balanced_accuracy(r: Results) -> float:
    """Balanced accuracy of the label directly_addresses against the rest on the human set: the
    mean of the shares of relevant answers labelled directly_addresses and of irrelevant ones
    labelled otherwise (production_mix.json's human_labels)."""
    labels = r.get("production_mix:human_labels")
    return (labels["relevant_directly_addresses"]["share"] + 1 - labels["not_relevant_directly_addresses"]["share"]) / 2


@table("quality.human")
def _quality_human(r: Results) -> str:
    header = ["method", "ExpertQA AUROC", "HaluQuestQA AUROC", "pooled AUROC", "label balanced accuracy"]
    rows = []
    for config, label in [(DEFAULT_CALIBRATED, "**`ragas_judge_intent` (default), calibrated**"), *QUALITY_ROWS]:
        human = _report(r, config)["human"]
        cells = [with_ci(human[s]["auroc"], human[s]["auroc_ci"], ".2f") for s in ("expertqa", "haluquestqa")]
        cells.append(with_ci(human["pooled"]["auroc"], human["pooled"]["auroc_ci"], ".2f") + f" (n={human['pooled']['n']})")
        cells.append(fmt(_human_label_balanced_accuracy(r), ".2f") if config == DEFAULT_CALIBRATED else "-")
        rows.append([label, *cells])
    return md_table(header, rows)


@table("quality.pairs")
def _quality_pairs(r: Results) -> str:
    header = ["method", *[k.replace("_", "-") for k in PAIR_KINDS]]
    rows = []
    for pair_set, language in (("pairs_en", "English"), ("pairs_zh", "Chinese")):
        default = _report(r, DEFAULT_CALIBRATED)["pairs"][pair_set]
        rows.append([f"**{language} ({default['evasive_answer']['n']} rows)**", *[""] * len(PAIR_KINDS)])
        cells = []
        for kind in PAIR_KINDS:
            cell = default[f"{kind}_answer"]
            acc = f"**{fmt(cell['accuracy'], '.2f')}** [{fmt(cell['accuracy_ci'][0], '.2f')}, {fmt(cell['accuracy_ci'][1], '.2f')}]"
            cells.append(f"{acc}, gap {fmt(cell['mean_gap'], '.2f')}, n={cell['n']}")
        rows.append(["**`ragas_judge_intent` (default), calibrated**", *cells])
        for config, label in QUALITY_ROWS:
            pairs = _report(r, config)["pairs"][pair_set]
            rows.append([label, *[_acc(pairs[f"{kind}_answer"]) for kind in PAIR_KINDS]])
    return md_table(header, rows)


@table("quality.low_label_share")
def _quality_low_label_share(r: Results) -> str:
    header = ["share labelled `does_not_address` or `somewhat_related`", *[k.replace("_", "-") for k in PAIR_KINDS]]
    rows = []
    for pair_set, language in (("pairs_en", "English"), ("pairs_zh", "Chinese")):
        pairs = _report(r, DEFAULT_CALIBRATED)["pairs"][pair_set]
        rows.append([language, *[f"{fmt(pairs[f'{k}_answer']['low_label_share'], '.2f')} (n={pairs[f'{k}_answer']['n']})" for k in PAIR_KINDS]])
    return md_table(header, rows)


def _pair_cells(r: Results, config: str = DEFAULT_CALIBRATED) -> list[dict]:
    return [cell for pair_set in ("pairs_en", "pairs_zh") for cell in _report(r, config)["pairs"][pair_set].values()]


@derived("quality.pair_answers")
def _pair_answers(r: Results) -> int:
    """Answers of the pair sets: each row's reference answer and its scored variants."""
    rows = sum(_report(r, DEFAULT_CALIBRATED)["pairs"][s]["evasive_answer"]["n"] for s in ("pairs_en", "pairs_zh"))
    return rows + sum(cell["n"] for cell in _pair_cells(r))


@derived("quality.echo_hedge_low_labels")
def _echo_hedge_low_labels(r: Results) -> str:
    """'N of M': echo and hedge answers of both pair sets labelled below partially_addresses."""
    cells = [_report(r, DEFAULT_CALIBRATED)["pairs"][s][f"{k}_answer"] for s in ("pairs_en", "pairs_zh") for k in ("echo", "hedge")]
    low = sum(round(c["low_label_share"] * c["n"]) for c in cells)
    return f"{low} of {sum(c['n'] for c in cells)}"


def _gaps(r: Results, kinds: list[str], config: str = DEFAULT_CALIBRATED) -> list[float]:
    return [_report(r, config)["pairs"][s][f"{k}_answer"]["mean_gap"] for s in ("pairs_en", "pairs_zh") for k in kinds]


@derived("quality.gap_range_clear_failures")
def _gap_range(r: Results) -> str:
    """The range of the default's mean calibrated gap over the evasive, off-topic, echo and hedge
    pairs of both languages."""
    gaps = _gaps(r, ["evasive", "off_topic", "echo", "hedge"])
    return f"{min(gaps):.2f}-{max(gaps):.2f}"


# ---- speed: benchmarks/results/speed_*.json (python -m benchmarks.speed)


def _speed(r: Results, stem: str, key: str = "seconds_per_evaluation") -> float:
    return r.get(f"{stem}:{key}")


def _mean_speed(r: Results, stems: list[str]) -> float:
    return sum(_speed(r, s) for s in stems) / len(stems)


JUDGE_ROUNDS = ["speed_ragas_judge_1", "speed_ragas_judge_2"]
DEFAULT_ROUNDS = ["speed_ragas_judge_intent_1", "speed_ragas_judge_intent_2"]


@derived("speed.default_over_judge")
def _default_over_judge(r: Results) -> float:
    """The default's seconds per evaluation over ragas_judge's, both rounds pooled."""
    return _mean_speed(r, DEFAULT_ROUNDS) / _mean_speed(r, JUDGE_ROUNDS)


@derived("speed.default_over_judge_round_1")
def _default_over_judge_1(r: Results) -> float:
    return _speed(r, DEFAULT_ROUNDS[0]) / _speed(r, JUDGE_ROUNDS[0])


@derived("speed.default_over_judge_round_2")
def _default_over_judge_2(r: Results) -> float:
    return _speed(r, DEFAULT_ROUNDS[1]) / _speed(r, JUDGE_ROUNDS[1])


@table("speed.methods")
def _speed_methods(r: Results) -> str:
    header = ["method", "s / evaluation (round 1, round 2)", "median latency", "chat requests", "WikiEval pairwise (10 pairs)"]
    rows = []
    for stems, label, requests, bold in ((JUDGE_ROUNDS, "`ragas_judge` (previous default)", "2", False), (DEFAULT_ROUNDS, "**`ragas_judge_intent` (default)**", "3, + 1 per new question", True)):
        seconds = ", ".join(fmt(_speed(r, s), ".2f") for s in stems)
        rows.append([
            label,
            f"**{seconds}**" if bold else seconds,
            ", ".join(fmt(_speed(r, s, "median_latency_seconds"), ".1f") + " s" for s in stems),
            requests,
            ", ".join(fmt(_speed(r, s, "pairwise_accuracy"), ".2f") for s in stems),
        ])
    return md_table(header, rows)


# ---- docs/calibration.md: benchmarks/results/production_mix.json (python -m benchmarks.production_mix),
# relevancy_tracer/calibrations/ragas_judge_intent-local.json (python -m benchmarks.fit_calibration)

SHIPPED_CALIBRATION = "relevancy_tracer/calibrations/ragas_judge_intent-local"
FAILURE_KINDS = ["echo", "hedge", "evasive", "off_topic", "padded", "incomplete"]


@table("calibration.production_mix")
def _calibration_production_mix(r: Results) -> str:
    header = ["rows", "n", "ECE at prior 0.8 [95% CI]", "mean score", "mean score of relevant answers", "AUROC"]
    rows = []
    for key, label in (("pairs_held_out", "pair sets and WikiEval, held out of the fit"), ("pairs_all", "pair sets and WikiEval, all"), ("human_all", "human set (never fitted on)")):
        c = r.get(f"production_mix:calibration.{key}")
        rows.append([label, str(c["n"]), with_ci(c["ece"], c["ci"], ".3f"), fmt(c["mean_score"], ".2f"), fmt(c["mean_score_relevant"], ".2f"), fmt(c["auroc"], ".2f")])
    header[2] = f"ECE at prior {fmt(r.get('production_mix:prior'))} [95% CI]"
    return md_table(header, rows, ["---", "---:", "---", "---:", "---:", "---:"])


@table("calibration.labels")
def _calibration_labels(r: Results) -> str:
    labels = r.get("production_mix:labels.held_out")
    names = {"echo": "echoes", "hedge": "hedges", "evasive": "evasive answers", "off_topic": "off-topic answers", "padded": "padded answers", "incomplete": "incomplete answers"}
    rows = [("reference answers labelled `directly_addresses`", labels["reference_directly_addresses"])]
    rows += [(f"{names[k]} labelled below `partially_addresses`", labels[f"{k}_below_partially"]) for k in FAILURE_KINDS]
    return md_table(["answers (held-out rows)", "share [95% CI]"], [[label, with_ci(c["share"], c["ci"], ".2f") + f" (n={c['n']})"] for label, c in rows])


@table("calibration.failure_kinds")
def _calibration_failure_kinds(r: Results) -> str:
    kinds = [*FAILURE_KINDS, "other"]
    every = r.get("production_mix:failure_kinds.all")
    held = r.get("production_mix:failure_kinds.held_out")
    rows = [[kind, str(every[kind]["n"]), *[str(every[kind]["counts"].get(k, 0)) for k in kinds], fmt(every[kind]["accuracy"], ".2f"), fmt(held[kind]["accuracy"], ".2f")] for kind in FAILURE_KINDS]
    return md_table(["variant", "n", *kinds, "accuracy", "held-out accuracy"], rows, ["---"] + ["---:"] * (len(kinds) + 3))


@derived("calibration.human_mean_score_irrelevant")
def _human_mean_score_irrelevant(r: Results) -> float:
    """Mean score of the human set's irrelevant answers, from the prior-weighted mean score and
    the relevant answers' mean: mean = share * relevant + (1 - share) * irrelevant."""
    c = r.get("production_mix:calibration.human_all")
    return (c["mean_score"] - c["relevant_share"] * c["mean_score_relevant"]) / (1 - c["relevant_share"])


@derived("calibration.raw_to_score")
def _raw_to_score(r: Results) -> str:
    """Raw score -> score under the shipped calibration's prior: evidence = a * raw + b (the
    class-balanced Platt map, base rate 0.5), score = sigmoid(evidence + logit(prior))."""
    import math

    shipped = r(SHIPPED_CALIBRATION)
    a, b, prior = shipped["params"]["a"], shipped["params"]["b"], shipped["prior"]
    if shipped.get("kind") != "platt" or shipped.get("base_rate") != 0.5:
        raise FigureError(f"{SHIPPED_CALIBRATION}.json is not a class-balanced Platt calibration")
    pairs = []
    for raw in (0.6, 0.7, 0.8, 0.85, 0.9):
        score = 1 / (1 + math.exp(-(a * raw + b + math.log(prior / (1 - prior)))))
        pairs.append(f"{raw:g} -> {score:.2f}")
    return ", ".join(pairs)


# ---- docs/benchmarks.md

# model host: benchmarks/results/model_host_latency.json, model_host_forked.json (python -m benchmarks.model_host)

LATENCY_ROWS = [
    ("off", "off (`sample_ratio=0`)"),
    ("in-process", "in the app's process (`local_host=false`)"),
    ("host-nice", "model host at nice 19 only"),
    ("host", "**model host (default: nice 19 + `SCHED_IDLE`)**"),
]


@table("model_host.latency")
def _model_host_latency(r: Results) -> str:
    rounds = r.get("model_host_latency:rounds")

    def both(variant: str, key: str, spec: str) -> str:
        return " / ".join(fmt(rnd["variants"][variant][key], spec) for rnd in rounds)

    rows = []
    for variant, label in LATENCY_ROWS:
        evaluations = "-" if variant == "off" else both(variant, "evaluations_finished", "d")
        ratio = "1.00" if variant == "off" else " / ".join(fmt(rnd["p99_ratio_vs_off"][variant], ".2f") for rnd in rounds)
        rows.append([label, both(variant, "p50_ms", ".2f"), both(variant, "p99_ms", ".2f"), both(variant, "max_ms", ".1f"), evaluations, f"**{ratio}**" if variant == "host" else ratio])
    seconds = fmt(r.get("model_host_latency:seconds"), "g")
    return md_table(["scorer", "p50 ms", "p99 ms", "max ms", f"evaluations in {seconds} s", "p99 / p99 off"], rows, ["---"] + ["---:"] * 5)


def _latency_max(r: Results, variant: str) -> float:
    return max(rnd["variants"][variant]["max_ms"] for rnd in r.get("model_host_latency:rounds"))


@derived("model_host.max_ms_host")
def _max_host(r: Results) -> float:
    """The default host's worst app call over the rounds, ms."""
    return _latency_max(r, "host")


@derived("model_host.max_ms_host_nice")
def _max_host_nice(r: Results) -> float:
    """The nice-19-only host's worst app call over the rounds, ms."""
    return _latency_max(r, "host-nice")


@derived("model_host.app_cpu_share")
def _app_cpu_share(r: Results) -> float:
    """The app's CPU per evaluation with the host, as a share of an in-process evaluation's (round 1)."""
    variants = r.get("model_host_latency:rounds.0.variants")
    return variants["host"]["app_cpu_ms_per_evaluation"] / variants["in-process"]["app_cpu_ms_per_evaluation"]


FORKED_ROWS = [("1x in-process", "1 process, in process"), ("4x in-process", "4 forked workers, in process"), ("4x host", "4 forked workers, model host")]


def _layout(r: Results, name: str) -> dict:
    for layout in r.get("model_host_forked:layouts"):
        if layout["layout"] == name:
            return layout
    raise FigureError(f"model_host_forked.json has no layout {name!r}")


@table("model_host.forked")
def _model_host_forked(r: Results) -> str:
    versus = r.get("model_host_forked:evaluations_per_s_vs_1_process")
    rows = []
    for name, label in FORKED_ROWS:
        layout = _layout(r, name)
        apps = layout["app_uss_mib"]
        host = name == "4x host"
        uss = f"{fmt(apps[0], '.0f')} MiB" if len(apps) == 1 else f"{fmt(sum(apps) / len(apps), '.0f')} MiB each (+{fmt(layout['parent_uss_mib'], '.0f')} parent)"
        bold = (lambda text: f"**{text}**") if host else (lambda text: text)
        rows.append([
            label,
            bold(fmt(layout["evaluations_per_s"], ".3f")),
            bold(fmt(versus[name], ".2f")),
            (f"**{uss.split(' ', 1)[0]} MiB** {uss.split(' ', 2)[2]}" if host else uss),
            "-" if layout["host_uss_mib"] is None else f"{fmt(layout['host_uss_mib'], '.0f')} MiB",
            bold(str(layout["llama_contexts"])),
            bold(str(layout["model_threads_total"])),
        ])
    return md_table(["layout", "evaluations/s", "vs 1 process", "USS per app process", "USS of the host", "llama.cpp contexts", "their threads"], rows, ["---"] + ["---:"] * 6)


@derived("model_host.forked_host_vs_in_process")
def _forked_host_vs_in_process(r: Results) -> float:
    """4 forked workers through the host against 4 forked in-process workers, evaluations/s."""
    return _layout(r, "4x host")["evaluations_per_s"] / _layout(r, "4x in-process")["evaluations_per_s"]


# overload: benchmarks/results/overload.json (python -m benchmarks.overload)


def _overload_table(r: Results, variant: str) -> str:
    rows = []
    for phase in r.get(f"overload:variants.{variant}.phases"):
        over = phase["factor"] >= 5
        bold = (lambda text: f"**{text}**") if over else (lambda text: text)
        shed = phase["share_shed"]
        rows.append([
            phase["phase"],
            str(phase["calls"]),
            bold(fmt(phase["scored_vs_capacity"], ".2f")),
            bold(fmt(phase["share_timeout"], ".2g") if phase["share_timeout"] else "0"),
            fmt(shed, ".2f") if shed else "0",
            str(phase["scored_after_hold"]),
            fmt(phase["sample_ratio_at_end"], ".2f"),
            fmt(phase["p99_ms"], ".1f"),
        ])
    return md_table(["offered", "calls", "scored rate / capacity", "timeout", "shed (`capacity`)", "scored after the hold", "effective sample ratio at the end", "p99 ms"], rows, ["---"] + ["---:"] * 7)


@table("overload.paced_host")
def _overload_paced(r: Results) -> str:
    return _overload_table(r, "paced-host")


@table("overload.default")
def _overload_default(r: Results) -> str:
    return _overload_table(r, "default")


def _phases(r: Results, variant: str, at_least: float = 1.0) -> list[dict]:
    return [p for p in r.get(f"overload:variants.{variant}.phases") if p["factor"] >= at_least]


def _load_range(r: Results, variant: str) -> str:
    loads = [value for p in r.get(f"overload:variants.{variant}.phases") for value in (p["load_before"], p["load_after"])]
    return f"{min(loads):.0f}-{max(loads):.0f}"


@derived("overload.load_paced_host")
def _load_paced(r: Results) -> str:
    """The 1-minute load average's range over the paced-host phases (rounded)."""
    return _load_range(r, "paced-host")


@derived("overload.load_default")
def _load_default(r: Results) -> str:
    """The 1-minute load average's range over the default's phases (rounded)."""
    return _load_range(r, "default")


@derived("overload.default_capacity_estimates")
def _capacity_estimates(r: Results) -> str:
    """The admission's capacity estimate at the end of the 2x, 5x and 10x phases."""
    estimates = [fmt(p["capacity_estimate_at_end"], ".2f") for p in _phases(r, "default", 2.0)]
    return ", ".join(estimates[:-1]) + " and " + estimates[-1]


@derived("overload.default_sustained")
def _default_sustained(r: Results) -> str:
    """The range of the default's scored rate over the phases offered at least its capacity."""
    rates = [p["scored_rate"] for p in _phases(r, "default")]
    return f"{min(rates):.2f}-{max(rates):.2f}"


@derived("overload.default_seconds_between")
def _default_seconds_between(r: Results) -> str:
    """Seconds between scored evaluations at the phases' scored rates (at least capacity offered)."""
    rates = [p["scored_rate"] for p in _phases(r, "default")]
    low, high = f"{1 / max(rates):.0f}", f"{1 / min(rates):.0f}"
    return low if low == high else f"{low}-{high}"


@derived("overload.default_scored_per_phase")
def _default_scored_per_phase(r: Results) -> str:
    """The range of evaluations scored per phase (at least capacity offered)."""
    scored = [p["scored_of_offered"] for p in _phases(r, "default")]
    return f"{min(scored)}-{max(scored)}"


@derived("overload.handler_ms_default")
def _handler_default(r: Results) -> float:
    """The handler's median wall time at 1x in the default's run, ms (its calibrated CPU work)."""
    return _phases(r, "default")[0]["p50_ms"]


@derived("overload.handler_ms_paced_host")
def _handler_paced(r: Results) -> float:
    """The handler's median wall time at 1x in the paced run, ms."""
    return _phases(r, "paced-host")[0]["p50_ms"]


# throughput: benchmarks/results/throughput.json (python -m benchmarks.throughput)

THROUGHPUT_ROWS = [
    ("rt-joint", 'relevancy-tracer, `generation="joint"` (default)'),
    ("rt-independent", 'relevancy-tracer, `generation="independent"`'),
    ("ragas-collections", "ragas `collections.AnswerRelevancy` (ragas 0.4's API)"),
    ("ragas-legacy", "ragas `ResponseRelevancy` (legacy, one request with `n=3`)"),
]


@table("throughput.variants")
def _throughput_variants(r: Results) -> str:
    rows = []
    for variant, label in THROUGHPUT_ROWS:
        v = r.get(f"throughput:results.{variant}")
        rows.append([label, fmt(v["evaluations_per_second"], ".1f"), fmt(v["chat_requests_per_evaluation"], "g"), fmt(v["embedding_requests_per_evaluation"], "g"), fmt(v["prompt_tokens_per_evaluation"], ".0f"), fmt(v["client_cpu_ms_per_evaluation"], ".1f")])
    return md_table(["variant", "evals/s", "chat req/eval", "embed req/eval", "prompt tokens/eval", "client CPU ms/eval"], rows, ["---"] + ["---:"] * 5)


@table("throughput.ratios")
def _throughput_ratios(r: Results) -> str:
    rows = []
    for peer, label in (("ragas-collections", "joint / ragas collections"), ("ragas-legacy", "joint / ragas legacy")):
        ratio = r.get(f"throughput:ratios.rt-joint / {peer}")
        rounds = ratio["throughput_per_round"]
        throughput_met, tokens_met = ratio["throughput"] >= 3, ratio["prompt_tokens"] <= 0.5
        verdict = "met" if throughput_met and tokens_met else f"throughput {'met' if throughput_met else 'not'}, tokens {'met' if tokens_met else 'not'}"
        tokens = fmt(ratio["prompt_tokens"], ".2f") + "x"
        rows.append([label, f"**{fmt(ratio['throughput'], '.2f')}x** ({fmt(min(rounds), '.2f')}-{fmt(max(rounds), '.2f')}x)", f"**{tokens}**" if tokens_met else tokens, verdict])
    return md_table(["ratio", "throughput (per round)", "prompt tokens", "target: >= 3x, <= 0.5x tokens"], rows)


# overhead: benchmarks/results/overhead.json (python -m benchmarks.overhead)

OVERHEAD_ROWS = [
    ("rt-unsampled", "relevancy-tracer, unsampled", "median"),
    ("rt-sampled-closed", "relevancy-tracer, sampled, endpoint a closed port", "p99"),
    ("rt-sampled-hang", "relevancy-tracer, sampled, endpoint never answers", "p99"),
    ("openinference-chain", "OpenInference `tracer.chain`", None),
    ("langfuse-observe", "Langfuse `@observe`", None),
    ("traceloop-workflow", "OpenLLMetry `@workflow`", None),
]


def _timing(r: Results, variant: str) -> dict:
    for timing in r.get("overhead:timings"):
        if timing["variant"] == variant:
            return timing
    raise FigureError(f"overhead.json has no timing of {variant!r}")


@table("overhead.variants")
def _overhead_variants(r: Results) -> str:
    targets = {t: v for t, v in r.get("overhead:targets").items()}
    unsampled_target = next(name for name in targets if name.startswith("unsampled median within"))
    median_target = unsampled_target.split("within ")[1].split("x")[0]
    rows = []
    for variant, label, target in OVERHEAD_ROWS:
        timing = _timing(r, variant)
        stats = timing["stats"][variant]
        median = fmt(timing["median_ratio"], ".2f") + "x"
        p99 = fmt(timing["p99_ratio"], ".2f") + "x"
        if target == "median":
            median = f"**{median}** (target {median_target}x)"
        elif target == "p99":
            p99 = f"**{p99}** (target 3x)"
        rows.append([label, fmt(stats["median_ns"] / 1000, ".1f"), fmt(stats["p99_ns"] / 1000, ".1f"), median, p99])
    return md_table(["variant", "median µs", "p99 µs", "median / bare span", "p99 / bare span p99"], rows, ["---"] + ["---:"] * 4)


@derived("overhead.rss_growth")
def _rss_growth(r: Results) -> str:
    """RSS growth from the first to the last memory checkpoint, MiB, signed."""
    return f"{r.get('overhead:memory.rss_growth_mib_first_to_last_checkpoint'):+.1f}"


@derived("overhead.max_spans_open")
def _max_spans_open(r: Results) -> int:
    """The most spans held open at any memory checkpoint."""
    return max(c["spans_open"] for c in r.get("overhead:memory.checkpoints"))


# the peer on the embedded model: benchmarks/results/local.json, local_c4.json (python -m benchmarks.local)

LOCAL_KINDS_DEFAULT = ["incomplete", "evasive", "off_topic", "padded", "echo", "hedge"]


def _local_row(side: dict, kinds: list[str], bold: bool, ours_bold_against: Optional[dict]) -> list[str]:
    tokens = "-" if side["input_tokens_per_eval"] is None else f"{fmt(side['input_tokens_per_eval'], '.0f')} / {fmt(side['output_tokens_per_eval'], '.0f')}"
    seconds = fmt(side["seconds_per_eval"], ".2f" if not bold else ".1f" if side["seconds_per_eval"] >= 10 else ".2f")
    cells = [f"**{seconds}**" if bold else seconds, "-" if side["llm_calls_per_eval"] is None else fmt(side["llm_calls_per_eval"], ".2g"), tokens]
    for lang in ("pairs_en", "pairs_zh"):
        for kind in kinds:
            value = side["pairs"][lang][f"{kind}_answer"]["accuracy"]
            text = fmt(value, ".2f")
            better = ours_bold_against is not None and value > ours_bold_against["pairs"][lang][f"{kind}_answer"]["accuracy"]
            cells.append(f"**{text}**" if better else text)
    cells.append(str(side["failures"]))
    return cells


def _local_header(kinds: list[str], r: Results, stem: str) -> list[str]:
    cells = []
    for lang, code in (("pairs_en", "EN"), ("pairs_zh", "ZH")):
        for kind in kinds:
            n = r.get(f"{stem}:ragas.pairs.{lang}.{kind}_answer.n")
            name = kind.replace("_", "-")
            cells.append(f"{code} {name}" + (f" (n={n})" if n != r.get(f"{stem}:rows") else ""))
    return cells


@table("local.default")
def _local_default(r: Results) -> str:
    ragas, ours = r.get("local:ragas"), r.get("local:relevancy_tracer")
    header = ["method", "s / eval", "chat requests / eval", "tokens in / out per eval", *_local_header(LOCAL_KINDS_DEFAULT, r, "local"), "failures"]
    rows = [["ragas 0.4.3 (llama.cpp server)", *_local_row(ragas, LOCAL_KINDS_DEFAULT, False, None)], ["**relevancy-tracer `ragas_judge_intent`**", *_local_row(ours, LOCAL_KINDS_DEFAULT, True, ragas)]]
    return md_table(header, rows, ["---"] + ["---:"] * (len(header) - 1))


@table("local.ragas_judge_c4")
def _local_judge(r: Results) -> str:
    kinds = ["incomplete", "evasive", "off_topic", "padded"]
    ragas, ours = r.get("local_c4:ragas"), r.get("local_c4:relevancy_tracer")
    header = ["method", "s / eval", "chat requests / eval", "tokens in / out per eval", *_local_header(kinds, r, "local_c4"), "failures"]
    rows = [["ragas 0.4.3 (llama.cpp server)", *_local_row(ragas, kinds, False, None)], ["**relevancy-tracer `ragas_judge`**", *_local_row(ours, kinds, True, ragas)]]
    return md_table(header, rows, ["---"] + ["---:"] * (len(header) - 1))


# ---- docs/service.md: hostile_json.json (python -m benchmarks.hostile_json), selection.json
# (python -m benchmarks.selection), fleet.json and fleet_overload.json (python -m benchmarks.fleet)


def _hostile_json_shapes(r: Results, names: list[str]) -> list[float]:
    shapes = r.get("hostile_json:shapes")
    return [shapes[name]["cpu_seconds_per_mb"] for name in names]


@derived("hostile_json.megabytes")
def _hostile_megabytes(r: Results) -> float:
    """The bytes of one shape's spans, in MB (10^6 bytes)."""
    return r.get("hostile_json:shapes.plain.bytes") / 1e6


@derived("hostile_json.nested_range")
def _hostile_nested_range(r: Results) -> str:
    """CPU seconds per MB over the nested shapes (object, dict, messages, brackets), min-max."""
    values = _hostile_json_shapes(r, ["nested_object", "nested_dict", "nested_messages", "brackets"])
    return f"{min(values):.4f}-{max(values):.4f}"


@derived("hostile_json.worst")
def _hostile_worst(r: Results) -> float:
    """The most CPU seconds per MB of any shape."""
    return max(shape["cpu_seconds_per_mb"] for shape in r.get("hostile_json:shapes").values())


@derived("hostile_json.worst_ratio")
def _hostile_worst_ratio(r: Results) -> float:
    """The worst shape's CPU per MB over plain text's."""
    return max(shape["ratio_to_plain"] for shape in r.get("hostile_json:shapes").values())


def _selection(r: Results, kind: str, size: int) -> float:
    sizes = r.get("selection:sizes")
    if size not in sizes:
        raise FigureError(f"selection.json has no size {size}")
    return r.get(f"selection:seconds.{kind}")[sizes.index(size)]


@derived("selection.roots")
def _selection_roots(r: Results) -> str:
    """Seconds to select the root spans of one trace at 1k, 8k and 100k spans."""
    return " -> ".join(fmt(_selection(r, "roots", n), spec) for n, spec in ((1000, ".3f"), (8000, ".3f"), (100000, ".2f")))


@derived("selection.roots_growth")
def _selection_roots_growth(r: Results) -> float:
    """Time at 100k root spans over time at 1k (for 100x the spans)."""
    return _selection(r, "roots", 100000) / _selection(r, "roots", 1000)


@derived("selection.chain_100k")
def _selection_chain(r: Results) -> float:
    """Seconds for a 100k-span parent chain."""
    return _selection(r, "chain", 100000)


@table("fleet.scaling")
def _fleet_scaling(r: Results) -> str:
    rows = [[str(s["workers"]), fmt(s["evaluations_per_second"], ".1f"), fmt(s["queue_wait_ms_p50"] / 1000, ".1f") + " s", fmt(s["queue_wait_ms_p99"] / 1000, ".1f") + " s"] for s in r.get("fleet:scaling")]
    return md_table(["workers", "evaluations / s", "queue wait p50", "p99"], rows, ["---:"] * 4)


# ---- docs/deploying.md: deploy_local.json, deploy_openai.json (python -m benchmarks.deploy)


def _range(values: list[float]) -> str:
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return low if low == high else f"{low}-{high}"


@table("deploy.memory")
def _deploy_memory(r: Results) -> str:
    local, endpoint = r.get("deploy_local:idle.memory_mib"), r.get("deploy_openai:idle.memory_mib")
    rows = []
    for name, key in (("gunicorn master", "master"), ("each worker", "workers"), ("model host", "host")):
        cells = [name]
        for memory in (local, endpoint):
            processes = memory[key] if isinstance(memory[key], list) else [memory[key]]
            cells += [_range([p[kind] for p in processes]) for kind in ("rss", "uss", "pss")]
        rows.append(cells)
    return md_table(["process (MiB)", "embedded default: RSS", "USS", "PSS", "endpoint: RSS", "USS", "PSS"], rows, ["---"] + ["---:"] * 6)


@derived("deploy.local_pod_gib")
def _deploy_pod(r: Results) -> float:
    """The embedded default's pod of 2 workers: the PSS of all its processes, GiB."""
    memory = r.get("deploy_local:idle.memory_mib")
    return (memory["master"]["pss"] + sum(w["pss"] for w in memory["workers"]) + memory["host"]["pss"]) / 1024


@derived("deploy.local_worker_pss")
def _deploy_worker(r: Results) -> float:
    """What a further worker adds with the embedded default: a worker's mean PSS, MiB."""
    workers = r.get("deploy_local:idle.memory_mib.workers")
    return sum(w["pss"] for w in workers) / len(workers)


@derived("deploy.local_pending_shutdown")
def _deploy_pending_shutdown(r: Results) -> int:
    """The embedded default's pending evaluations that ended with status shutdown at SIGTERM."""
    return r.get("deploy_local:pending.statuses").count("shutdown")


@derived("deploy.local_scored")
def _deploy_scored(r: Results) -> int:
    """The embedded default's answers (asked two at a time) that were scored, on the answer
    span or past its hold on the linked EVALUATOR span."""
    return r.get("deploy_local:idle.outcomes").count("scored")


@derived("deploy.local_after_hold")
def _deploy_after_hold(r: Results) -> int:
    """Of those, the ones scored past the answer span's hold (the answer span says deferred)."""
    return r.get("deploy_local:idle.statuses").count("deferred")


@derived("speed.default_seconds")
def _speed_default_seconds(r: Results) -> float:
    """The default's seconds per evaluation on 2 cores (both rounds of the speed table)."""
    return _mean_speed(r, DEFAULT_ROUNDS)


# ---- docs/methods.md: compare_default.json (python -m benchmarks.compare_default), quality.json, speed_*.json


@derived("speed.judge_seconds")
def _speed_judge_seconds(r: Results) -> float:
    """ragas_judge's seconds per evaluation in the speed table (both rounds)."""
    return _mean_speed(r, JUDGE_ROUNDS)


@derived("quality.intent_echo_losses_en")
def _intent_echo_losses(r: Results) -> float:
    """The share of English echo pairs the intent judge alone loses (1 - pairwise accuracy)."""
    return 1 - r.get("quality:reports.intent.pairs.pairs_en.echo_answer.accuracy")


@derived("compare_default.wikieval_ragas_judge_wins")
def _wikieval_judge(r: Results) -> str:
    """'N': WikiEval pairs ragas_judge ranks right (of n)."""
    cell = r.get("compare_default:wikieval.poor_answer")
    return f"{cell['ragas_judge'] * cell['n']:.0f}"


@derived("compare_default.wikieval_ragas_intent_wins")
def _wikieval_intent(r: Results) -> str:
    """'N of n': WikiEval pairs ragas_intent ranks right."""
    cell = r.get("compare_default:wikieval.poor_answer")
    return f"{cell['ragas_intent (previous)'] * cell['n']:.0f} of {cell['n']}"


@derived("production_mix.mean_raw")
def _mean_raw(r: Results, pair_set: str, kind: str) -> float:
    """The default's mean raw score over one set's answers of one kind (``reference``, ``echo``,
    ...; production_mix_rows.json)."""
    raws = [row["raw"] for row in r.get("production_mix_rows:rows") if row["set"] == pair_set and row["kind"] == kind]
    if not raws:
        raise FigureError(f"production_mix_rows.json has no {kind} rows of {pair_set}")
    return sum(raws) / len(raws)


@derived("model_host.scripted_evaluations_per_s")
def _scripted_rate(r: Results) -> float:
    """Evaluations finished per second by the scripted host in the model-free latency run."""
    return r.get("model_host_latency_scripted:variants.scripted-host.evaluations_finished") / r.get("model_host_latency_scripted:seconds")


# ---- docs/quality.md, against the other methods: compare_default.json (python -m benchmarks.compare_default)

COMPARE_COLUMNS = ["ragas_judge_intent (default)", "ragas_intent (previous)", "ragas_judge", "intent", "judge component"]


def _signed(value: float) -> str:
    return f"{value:+.2f}"


@table("compare_default.pairs")
def _compare_default_pairs(r: Results, pair_set: str) -> str:
    header = ["kind", "rows", "**ragas_judge_intent** (default)", "ragas_intent (previous)", "ragas_judge", "intent", "judge component", "default - previous [95% CI]"]
    rows = []
    for cand, cell in r.get(f"compare_default:{pair_set}").items():
        difference = cell["ragas_judge_intent (default)"] - cell["ragas_intent (previous)"]
        low, high = cell["default_minus_previous_ci"]
        rows.append([cand.replace("_answer", ""), str(cell["n"]), *[fmt(cell[c], ".2f") for c in COMPARE_COLUMNS], f"{_signed(difference)} [{_signed(low)}, {_signed(high)}]"])
    return md_table(header, rows, ["---", "---:"] + ["---"] * 6)


@derived("compare_default.previous_echo_losses")
def _compare_echo_losses(r: Results, pair_set: str) -> float:
    """The share of a set's echo pairs ``ragas_intent`` (the default before ``ragas_judge``) ranks
    wrong: 1 - its pairwise accuracy."""
    return 1 - r.get(f"compare_default:{pair_set}.echo_answer")["ragas_intent (previous)"]


@derived("compare_default.min_echo_hedge")
def _compare_min_echo_hedge(r: Results) -> float:
    """The default's lowest pairwise accuracy over the echo and hedge pairs of both languages."""
    return min(r.get(f"compare_default:{s}.{k}_answer")["ragas_judge_intent (default)"] for s in ("pairs_en", "pairs_zh") for k in ("echo", "hedge"))


@derived("compare_default.none_below_zero")
def _compare_none_below_zero(r: Results) -> str:
    """'no interval lies below 0' when every default-minus-previous interval's upper end is >= 0
    (else the kinds where it is worse beyond noise)."""
    worse = [f"{s} {k}" for s in ("pairs_en", "pairs_zh", "wikieval") for k, c in r.get(f"compare_default:{s}").items() if c["default_minus_previous_ci"][1] < 0]
    return "no interval lies below 0" if not worse else "worse beyond noise on " + ", ".join(worse)


@derived("compare_default.wikieval_default_wins")
def _wikieval_default(r: Results) -> str:
    """'N of n': WikiEval pairs the default ranks right."""
    cell = r.get("compare_default:wikieval.poor_answer")
    return f"{cell['ragas_judge_intent (default)'] * cell['n']:.0f} of {cell['n']}"


@derived("production_mix.healthy_low_label_share")
def _healthy_low_label_share(r: Results) -> float:
    """The expected share of answers labelled does_not_address or somewhat_related on healthy
    traffic as tests/test_alerting.py draws it from production_mix_rows.json: a reference answer
    with the prior's probability, else a variant of a uniformly drawn kind (pair sets and
    WikiEval, not the human set)."""
    data = r("production_mix_rows")
    rows = [row for row in data["rows"] if row["set"] != "human"]

    def low(kind: str) -> float:
        chosen = [row for row in rows if row["kind"] == kind]
        return sum(row["label"] in ("does_not_address", "somewhat_related") for row in chosen) / len(chosen)

    variants = ["echo", "hedge", "evasive", "off_topic", "padded", "incomplete"]
    return data["prior"] * low("reference") + (1 - data["prior"]) * sum(low(k) for k in variants) / len(variants)


# ---- docs/index.md, docs/scoring.md: example_demo.json, example_score.json (python -m benchmarks.examples)

#: how the example RAG app answers a question its reference does not cover (examples/rag_app.py)
DEMO_UNKNOWN_PREFIX = "I don't know"


def _demo_group(r: Results, group: str) -> list[dict]:
    if group not in ("unknown", "known"):
        raise FigureError(f"no demo answer group {group!r}: unknown or known")
    return [a for a in r.get("example_demo:answers") if a["answer"].startswith(DEMO_UNKNOWN_PREFIX) == (group == "unknown")]


def _counted(values: list[str]) -> str:
    counts = sorted(((values.count(v), v) for v in set(values)), key=lambda item: (-item[0], item[1]))
    if len(counts) == 1:
        return f"all `{counts[0][1]}`"
    return ", ".join(f"{n} `{v}`" for n, v in counts)


@derived("examples.demo")
def _demo_answers(r: Results, group: str, what: str) -> str:
    """One group of the demo's answers (``unknown``: the app's "I don't know", ``known``: the
    others): ``count``, ``scores`` (lowest-highest, 3 decimals), ``labels`` or ``why`` (the failure
    kinds, ``none`` when none), as prose."""
    answers = _demo_group(r, group)
    if not answers:
        raise FigureError(f"example_demo.json has no {group} answer")
    if what == "count":
        return str(len(answers))
    if what == "scores":
        scores = [a["score"] for a in answers]
        low, high = f"{min(scores):.3f}", f"{max(scores):.3f}"
        return low if low == high else f"{low}-{high}"
    if what == "labels":
        return _counted([a["label"] for a in answers])
    if what == "why":
        kinds = [a["why"] for a in answers if a["why"]]
        return _counted(kinds) if kinds else "none"
    raise FigureError(f"examples.demo: no {what!r}: count, scores, labels or why")


# --------------------------------------------------------------------------------------------


def process(paths: Iterable[Path], write: bool, results: Optional[Results] = None) -> tuple[list[str], list[str]]:
    """Render each page; returns (pages whose figures were stale, errors). With ``write``, stale
    pages are rewritten."""
    results = results or Results()
    stale, errors = [], []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        try:
            rendered = render(text, results, where=_name(path))
        except FigureError as exc:
            errors.append(str(exc))
            continue
        if rendered != text:
            stale.append(_name(path) + _first_difference(text, rendered))
            if write:
                path.write_text(rendered, encoding="utf-8")
    return stale, errors


def _name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _first_difference(old: str, new: str) -> str:
    for number, (a, b) in enumerate(zip(old.splitlines(), new.splitlines()), start=1):
        if a != b:
            return f":{number}: {a.strip()[:160]!r} -> {b.strip()[:160]!r}"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when a page's figures differ from the results, 2 on a marker that cannot be rendered")
    mode.add_argument("--write", action="store_true", help="rewrite the figures of the pages from the results")
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md, benchmarks/README.md, docs/*.md")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    stale, errors = process(args.pages or default_pages(), write=args.write, results=Results(args.results))
    for error in errors:
        print(error, file=sys.stderr)
    for page in stale:
        print(("rewrote " if args.write else "stale: ") + page, file=sys.stderr)
    if errors:
        return 2
    if stale and args.check:
        print("run: python -m benchmarks.figures --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
