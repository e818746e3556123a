"""A small RAG app for the observability tests: one ``@relevancy_tracer.trace`` function called
in a loop, scored against an OpenAI-compatible server, exporting as the ``OTEL_*`` variables say.

Run as a subprocess (``python tests/traced_app.py --base-url URL ...``) so that
``relevancy_tracer.configure()`` installs the SDK providers from the environment exactly as in
a user's process. Prints ``ready`` once configured, then calls ``answer(QUESTION)``:

* ``--calls N``: N times, then ``relevancy_tracer.shutdown()`` (flushes spans and metrics);
* otherwise at ``--rate`` calls per second until its standard input closes.

Prints ``done <calls>`` before exiting with status 0.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import relevancy_tracer

QUESTION = "What is the capital of France?"
ANSWER = "Paris is the capital of France."


@relevancy_tracer.trace(name="answer_question")
def answer_question(question: str) -> str:
    """The app's RAG function: returns a fixed answer (its relevancy is decided by the embedder
    of the model server the test controls)."""
    return ANSWER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--calls", type=int, default=0, help="calls to make, then exit (0: until stdin closes)")
    parser.add_argument("--rate", type=float, default=5.0, help="calls per second in the run-until-stdin-closes mode")
    args = parser.parse_args(argv)

    relevancy_tracer.configure(
        llm="openai",
        embeddings="openai",
        llm_base_url=args.base_url,
        llm_model="fake-chat",
        embedding_model="fake-embed",
        llm_api_key="test-key",
        llm_max_retries=0,
        llm_timeout=10.0,
    )
    print("ready", flush=True)

    calls = 0
    if args.calls:
        for _ in range(args.calls):
            answer_question(QUESTION)
            calls += 1
    else:
        stop = threading.Event()

        def wait_for_eof() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=wait_for_eof, daemon=True).start()
        period = 1.0 / args.rate
        next_call = time.monotonic()
        while not stop.is_set():
            answer_question(QUESTION)
            calls += 1
            next_call += period
            stop.wait(max(0.0, next_call - time.monotonic()))  # pacing; returns at once on EOF
    ok = relevancy_tracer.shutdown(timeout=20.0)
    print(f"done {calls}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
