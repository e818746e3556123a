"""One embedded model host per (user, model set) on a machine.

The embedded models (llama.cpp chat model with its continuous-batching decoder, the local
embedder) run in a separate *model host* process, never in the app's address space:

* a native crash or the OOM killer in the scorer kills the host, not the app; the in-flight
  requests fail with :class:`ModelHostError` (evaluation status ``model_host_crashed``) and the
  next request restarts the host, with backoff, a bounded number of times;
* every process of the user that needs the same models (forked app workers, the CLI, ``serve``,
  fleet workers on the machine) connects to the one running host: one llama.cpp context and
  one thread pool on the machine, whose decoder batches requests of all its clients together;
* the host runs at a lower CPU priority than the app: ``nice`` (default 19) and, with nice 19,
  Linux's ``SCHED_IDLE`` policy, so a waking app thread preempts its threads at once (see
  :func:`lower_priority`).

Protocol: JSON over HTTP on a Unix domain socket (aiohttp's :class:`~aiohttp.web.UnixSite`),
forwarding exactly the two protocol calls (``POST /chat`` = ``ChatModel.chat_json``,
``POST /embed`` = ``Embedder.embed``) and ``POST /generate`` (``LocalChatModel.generate``).
The OpenAI API cannot express what the local chat model does with a call (the judge's digit
distribution ``score_probs`` for ``score_key``, the forced JSON prefix and reply limits, which
read the messages), so forwarding the calls themselves is what keeps the scores the same.

Files, in ``<cache dir>/hosts`` (mode 0700): ``<key>.sock`` (the HTTP socket, 0600),
``<key>.clients`` (presence socket, 0600), ``<key>.lock`` (start lock), ``<key>.log`` (the
host's stderr, faulthandler tracebacks of native crashes included). ``<key>`` is a hash of the
model set.

Lifetime: each client process holds one connection to the presence socket. The kernel closes it
when the process ends, however it ends (SIGKILL included), so the host knows its clients; it
exits ``idle_timeout`` seconds after the last one has gone. Two processes starting a host at
once serialise on ``flock`` of the lock file: the second finds the first's host running.

Run the host by hand: ``python -m relevancy_tracer.models.host --help``.

The code is in three modules: :mod:`~relevancy_tracer.models.host_spec` (the model set, the
files, the error, what both sides share), :mod:`~relevancy_tracer.models.host_client` (the
connection and the backends an app uses) and :mod:`~relevancy_tracer.models.host_server` (the
host process). This module names them all, and runs the host:
``python -m relevancy_tracer.models.host``.
"""

from __future__ import annotations

import sys

from .host_client import MAX_RESTARTS, RESTART_WINDOW, HostChatModel, HostConnection, HostEmbedder
from .host_server import lower_priority, main, scheduling_policy
from .host_spec import HOST_MODULE, PROTOCOL, START_TIMEOUT, HostPaths, HostSpec, ModelHostError, check_model_name, describe_exit, hosts_dir, serve_extra_models

__all__ = [
    "HOST_MODULE", "MAX_RESTARTS", "PROTOCOL", "RESTART_WINDOW", "START_TIMEOUT", "HostChatModel", "HostConnection", "HostEmbedder",
    "HostPaths", "HostSpec", "ModelHostError", "check_model_name", "describe_exit", "hosts_dir", "lower_priority", "main",
    "scheduling_policy", "serve_extra_models",
]

if __name__ == "__main__":
    sys.exit(main())
