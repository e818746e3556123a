"""The ``relevancy-tracer`` command: parses its arguments and dispatches to the module that does
the work.

* ``score INPUT [-o OUTPUT]``: score every row of a JSONL, CSV or Parquet file (or standard
  input), written in input order with a summary on stderr (:mod:`relevancy_tracer.batch.score`).
* ``calibrate INPUT -o CALIBRATION``: fit a calibration on labelled rows and print its
  reliability (:mod:`relevancy_tracer.batch.calibrate`).
* ``demo``: the example RAG app traced into a local Arize Phoenix (:mod:`relevancy_tracer.demo`).
* ``serve``: receive OTLP traces and logs and score the spans of apps that never import this
  package, in process or onto a Redis Stream (:mod:`relevancy_tracer.service.scoring_service`).
* ``worker``: consume that Redis Stream: score, export, acknowledge
  (:mod:`relevancy_tracer.service.fleet_worker`).
* ``backfill``: score spans already stored in Phoenix and annotate them
  (:mod:`relevancy_tracer.service.backfill`).
* ``settings-table``: print the configuration reference, or write or check it in a Markdown
  file (:func:`relevancy_tracer.config.settings_table`).

``relevancy-tracer COMMAND --help`` lists each command's flags. Exit status 2 for bad arguments
or an unreadable input; otherwise each command's own (see its module).
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path
from typing import Optional, Sequence

from .config import GENERATION_MODES, NONCOMMITTAL_RULES, Settings, settings_table, update_settings_table
from .dataset.columns import ColumnMapping
from .scoring.methods import METHODS


def _settings_from(args: argparse.Namespace) -> Settings:
    overrides = {
        name: getattr(args, name)
        for name in (
            "method",
            "strictness",
            "noncommittal",
            "generation",
            "concurrency",
            "llm",
            "llm_model",
            "llm_base_url",
            "embeddings",
            "embedding_model",
            "embedding_base_url",
            "calibration",
        )
        if getattr(args, name, None) is not None
    }
    return Settings.resolve(**overrides)


def _mapping_of(args: argparse.Namespace) -> ColumnMapping:
    return ColumnMapping(question=args.question_column, answer=args.answer_column, contexts=args.contexts_column)


def cmd_score(args: argparse.Namespace) -> int:
    from .batch.score import score_file

    settings = _settings_from(args)
    return score_file(args.input, args.output, settings, _mapping_of(args), input_format=args.format, output_format=args.output_format, limit=args.limit, progress=not args.no_progress)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .batch.calibrate import calibrate_file

    if args.prior is not None and not 0.0 < args.prior < 1.0:
        print(f"relevancy-tracer: error: --prior must lie strictly between 0 and 1; got {args.prior}", file=sys.stderr)
        return 2
    settings = _settings_from(args)
    return calibrate_file(
        args.input,
        args.output,
        settings,
        _mapping_of(args),
        label_column=args.label_column,
        raw_column=args.raw_column,
        kind=args.kind,
        prior=args.prior,
        folds=args.folds,
        input_format=args.format,
        limit=args.limit,
        progress=not args.no_progress,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from .service.run import run_serve

    settings = _settings_from(args)
    if args.phoenix_url:
        settings = settings.replace(phoenix_url=args.phoenix_url)
    return run_serve(settings, queue_url=args.queue, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port, tls_cert=args.tls_cert, tls_key=args.tls_key, allow_unauthenticated=args.allow_unauthenticated, shutdown_timeout=args.shutdown_timeout)


def cmd_worker(args: argparse.Namespace) -> int:
    from .service.run import run_worker

    settings = _settings_from(args)
    if args.phoenix_url:
        settings = settings.replace(phoenix_url=args.phoenix_url)
    if args.max_deliveries is not None:
        settings = settings.replace(max_deliveries=args.max_deliveries)
    return run_worker(args.queue, settings, claim_idle=args.claim_idle, max_jobs=args.max_jobs)


def cmd_backfill(args: argparse.Namespace) -> int:
    from .service.run import run_backfill

    return run_backfill(args.phoenix, args.project, _settings_from(args), since=args.since, state=args.state)


def cmd_settings_table(args: argparse.Namespace) -> int:
    if args.write is None and args.check is None:
        print(settings_table())
        return 0
    path = Path(args.write or args.check)
    if update_settings_table(path, check=args.check is not None):
        return 0
    print(f"{path}: the configuration table is out of date; run: relevancy-tracer settings-table --write {path}", file=sys.stderr)
    return 1


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Method and model flags of the commands that score (override the settings)."""
    parser.add_argument("--method", choices=tuple(METHODS))
    parser.add_argument("--strictness", type=int, help="questions generated per answer (N)")
    parser.add_argument("--noncommittal", choices=NONCOMMITTAL_RULES)
    parser.add_argument("--generation", choices=GENERATION_MODES)
    parser.add_argument("--concurrency", type=int, help="rows scored at once")
    parser.add_argument("--llm", choices=("local", "openai"))
    parser.add_argument("--llm-model")
    parser.add_argument("--llm-base-url")
    parser.add_argument("--embeddings", choices=("local", "openai"))
    parser.add_argument("--embedding-model")
    parser.add_argument("--embedding-base-url")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relevancy-tracer", description="Answer-relevancy scoring and tracing for RAG apps.")
    sub = parser.add_subparsers(dest="command", required=True)

    score = sub.add_parser("score", help="score a JSONL, CSV or Parquet dataset")
    score.add_argument("input", help="input file (.jsonl, .csv, .parquet), a FIFO or pipe (with --format), or - for standard input (JSONL unless --format)")
    score.add_argument("-o", "--output", help="output file (.jsonl, .csv, .parquet); default: JSONL on stdout")
    score.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: from the file name)")
    score.add_argument("--output-format", choices=("jsonl", "csv", "parquet"), help="output format (default: from the file name)")
    score.add_argument("--question-column", help="column or dotted path of the question (default: question | user_input | query)")
    score.add_argument("--answer-column", help="column or dotted path of the answer (default: answer | response)")
    score.add_argument("--contexts-column", help="column or dotted path of the contexts (default: contexts | retrieved_contexts)")
    _add_model_flags(score)
    score.add_argument("--calibration", help="auto (default), none, or a calibration JSON file from `relevancy-tracer calibrate`")
    score.add_argument("--limit", type=int, help="score only the first N rows")
    score.add_argument("--no-progress", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score)

    calibrate = sub.add_parser("calibrate", help="fit a calibration (raw score -> probability of relevant) on labelled rows")
    calibrate.add_argument("input", help="labelled rows (.jsonl, .csv, .parquet, or - for standard input) with question, answer and a 0/1 label")
    calibrate.add_argument("-o", "--output", required=True, help="calibration JSON file to write")
    calibrate.add_argument("--label-column", default="label", help="column or dotted path of the 0/1 label (1: the answer addresses the question)")
    calibrate.add_argument("--raw-column", help="use raw scores from this column instead of scoring the rows (e.g. raw_score of a `score` output made with the same settings)")
    calibrate.add_argument("--kind", choices=("platt", "isotonic"), default="platt", help="Platt scaling (default; class-balanced, so the map is the evidence and the prior is stated apart) or isotonic regression")
    calibrate.add_argument("--prior", type=float, default=None, help="the share of relevant answers in the traffic the scores are for, in (0, 1) (default: these rows' share, right when they are a random sample of it)")
    calibrate.add_argument("--folds", type=int, default=5, help="folds of the cross-validated calibration error")
    calibrate.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: from the file name)")
    calibrate.add_argument("--question-column", help="column or dotted path of the question")
    calibrate.add_argument("--answer-column", help="column or dotted path of the answer")
    calibrate.add_argument("--contexts-column", help="column or dotted path of the contexts")
    _add_model_flags(calibrate)
    calibrate.add_argument("--limit", type=int, help="use only the first N rows")
    calibrate.add_argument("--no-progress", action="store_true", help="no progress bar")
    calibrate.set_defaults(func=cmd_calibrate)

    demo = sub.add_parser("demo", help="run the example RAG app with tracing into a local Phoenix")
    demo.add_argument("--questions", type=int, default=None, help="how many example questions to ask (default: all)")
    demo.add_argument("--phoenix-port", type=int, default=None, help="Phoenix port (default: PHOENIX_PORT or 4318)")
    demo.add_argument("--no-phoenix", action="store_true", help="do not start Phoenix; export to OTEL_EXPORTER_OTLP_ENDPOINT")
    demo.add_argument("--keep-running", action="store_true", help="keep Phoenix running after the demo until Ctrl-C")
    demo.add_argument("--extractive", action="store_true", help="the app answers with passage sentences instead of generating with the local LLM")
    demo.set_defaults(func=cmd_demo)

    serve = sub.add_parser("serve", help="receive OTLP traces and logs and score the spans of apps that never import this package")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (default 4318; 0: a free port)")
    serve.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (default 4317; 0: a free port)")
    serve.add_argument("--queue", help="redis://HOST:PORT/DB: queue jobs on a Redis Stream for `relevancy-tracer worker` processes (default: score in this process)")
    serve.add_argument("--phoenix-url", help="also write scores as Phoenix span annotations (default: RELEVANCY_TRACER_PHOENIX_URL)")
    serve.add_argument("--shutdown-timeout", type=float, default=20.0, help="seconds to stop on SIGTERM: requests in flight (2 s of it), then queued evaluations and the exporters (default 20: the exit stays inside Kubernetes' 30 s grace period)")
    serve.add_argument("--tls-cert", help="PEM certificate (chain): serve OTLP/HTTP as HTTPS and OTLP/gRPC over TLS (with --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--allow-unauthenticated", action="store_true", help="listen on a non-loopback --host without RELEVANCY_TRACER_SERVICE_TOKEN (only behind a Collector or proxy that authenticates)")
    _add_model_flags(serve)
    serve.set_defaults(func=cmd_serve, calibration=None)

    worker = sub.add_parser("worker", help="consume the Redis Stream that `serve --queue` fills: score, export, acknowledge")
    worker.add_argument("--queue", required=True, help="redis://HOST:PORT/DB")
    worker.add_argument("--phoenix-url", help="also write scores as Phoenix span annotations (default: RELEVANCY_TRACER_PHOENIX_URL)")
    worker.add_argument("--claim-idle", type=float, default=30.0, help="seconds a taken job may go without its worker extending the claim before another worker reclaims it; a job released after a transient failure waits this times 2^(deliveries-1) (default 30)")
    worker.add_argument("--max-deliveries", type=int, default=None, help="deliveries of a job before a failure is final and it moves to the dead-letter stream (default: RELEVANCY_TRACER_MAX_DELIVERIES or 5)")
    worker.add_argument("--max-jobs", type=int, default=None, help=argparse.SUPPRESS)
    _add_model_flags(worker)
    worker.set_defaults(func=cmd_worker, calibration=None)

    fill = sub.add_parser("backfill", help="score spans already stored in Phoenix and annotate them (idempotent, resumable)")
    fill.add_argument("--phoenix", required=True, help="Phoenix base URL")
    fill.add_argument("--project", required=True, help="Phoenix project name")
    fill.add_argument("--since", help="only spans started at or after this ISO 8601 time")
    fill.add_argument("--state", help="file keeping the page cursor, to resume an interrupted run")
    _add_model_flags(fill)
    fill.set_defaults(func=cmd_backfill, calibration=None)

    table = sub.add_parser("settings-table", help="print the configuration reference (Markdown), or write it between a file's <!-- settings-table --> markers")
    target = table.add_mutually_exclusive_group()
    target.add_argument("--write", metavar="FILE", help="replace the table in FILE")
    target.add_argument("--check", metavar="FILE", help="exit 1 when FILE's table is out of date")
    table.set_defaults(func=cmd_settings_table)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``relevancy-tracer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # A native crash (a fault in llama.cpp or another C extension) prints "Fatal Python error:
    # Segmentation fault" and every thread's Python stack, instead of a bare signal exit.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, ImportError, OSError) as exc:  # bad arguments, missing files
        print(f"relevancy-tracer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
