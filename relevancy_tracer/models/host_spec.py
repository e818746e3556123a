"""What the model host's clients and the host itself share: the model set (:class:`HostSpec`),
the files of one host (:class:`HostPaths`), its error (:class:`ModelHostError`), the protocol
version, and the extra models tests may register (:func:`serve_extra_models`; none in the
product). The client is :mod:`~relevancy_tracer.models.host_client`, the host process
:mod:`~relevancy_tracer.models.host_server`; :mod:`~relevancy_tracer.models.host` describes both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from .base import ModelError

logger = logging.getLogger("relevancy_tracer")

#: Bumped when the wire format changes; part of the host key, so old and new never mix.
PROTOCOL = 1
#: Seconds a client waits for a starting host to accept connections (the model loads lazily).
START_TIMEOUT = 60.0
#: The module a client runs (``python -m``) to start a host.
HOST_MODULE = "relevancy_tracer.models.host"

#: Models a host may serve besides the local ones: name -> factory returning a ChatModel or an
#: Embedder, and the module whose ``main`` starts such a host (it registers the same names).
#: Empty in the product. Only code running in this process fills it (:func:`serve_extra_models`:
#: the test suite's scripted models, ``relevancy_tracer_testing.use_scripted_host_models``);
#: no setting or environment variable reaches it, and no model name is ever imported.
_extra_models: dict[str, Callable[[], Any]] = {}
_host_module = [HOST_MODULE]


def serve_extra_models(factories: Mapping[str, Callable[[], Any]], host_module: str) -> None:
    """Let the model hosts of this process serve ``factories`` under their names (``llm_model``
    / ``embedding_model`` may then name them), starting hosts with ``python -m host_module``,
    whose ``main`` must make the same call before :func:`main`. For tests and benchmarks
    (scripted models in place of llama.cpp); a user's settings cannot reach it."""
    _extra_models.update(factories)
    _host_module[0] = host_module


def check_model_name(setting: str, name: Optional[str]) -> None:
    """Refuse a model name the host would not serve as a model: a ``module:function`` (a
    colon, and no such file), which earlier versions imported and called in the host. Names
    given to :func:`serve_extra_models` pass.

    Raises:
        ValueError: naming ``setting`` (``llm_model`` / ``embedding_model``) and the choices.
    """
    if not name or name in _extra_models or ":" not in name or os.path.exists(name):
        return
    from .local_embed import LOCAL_EMBEDDERS
    from .local_llm import LOCAL_MODELS

    choices = f"one of {', '.join(LOCAL_MODELS)} or a path to a GGUF file" if setting == "llm_model" else f"one of {', '.join(LOCAL_EMBEDDERS)}"
    raise ValueError(f"{setting} {name!r} is not a local model: use {choices} (a module:function is never imported)")


class ModelHostError(ModelError):
    """The model host died while a request was in flight, or cannot be (re)started.

    ``status`` is the evaluation status it becomes (``model_host_crashed``).
    """

    status = "model_host_crashed"


# ----------------------------------------------------------------------------- the model set


@dataclass(frozen=True)
class HostSpec:
    """The models one host serves, and how it runs.

    Attributes:
        llm: local chat model (name in ``LOCAL_MODELS`` or GGUF path) or None.
        threads: llama.cpp threads (None: the host's CPUs, see ``default_threads``).
        n_ctx: KV cache tokens. repack: ``auto | on | off``.
        embedder: local embedder name (``LOCAL_EMBEDDERS``) or None. A client refuses to
            start a host for a ``module:function`` (:meth:`check`).
        nice: CPU niceness added to the host (0-19). idle_timeout: seconds the host lives on
            after its last client has gone.
        sched_idle: also run the host under the ``SCHED_IDLE`` scheduling policy where the OS
            allows it (:func:`lower_priority`); :func:`~relevancy_tracer.models.host_spec`
            sets it for ``local_host_nice`` 19, the lowest priority.
    """

    llm: Optional[str] = None
    threads: Optional[int] = None
    n_ctx: int = 8192
    repack: str = "auto"
    embedder: Optional[str] = None
    nice: int = 19
    idle_timeout: float = 60.0
    sched_idle: bool = True

    def check(self) -> None:
        """Raise ValueError when a model name is one no host serves (:func:`check_model_name`)."""
        check_model_name("llm_model", self.llm)
        check_model_name("embedding_model", self.embedder)

    @property
    def key(self) -> str:
        """16 hex digits naming this model set (and the protocol version)."""
        ident = json.dumps([PROTOCOL, self.llm, self.threads, self.n_ctx, self.repack, self.embedder, self.nice, self.sched_idle], sort_keys=True)
        return hashlib.sha256(ident.encode()).hexdigest()[:16]

    def argv(self) -> list[str]:
        args = ["--n-ctx", str(self.n_ctx), "--repack", self.repack, "--nice", str(self.nice), "--idle-timeout", f"{self.idle_timeout:g}"]
        if self.sched_idle:
            args.append("--sched-idle")
        if self.llm:
            args += ["--llm", self.llm]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.embedder:
            args += ["--embedder", self.embedder]
        return args


def hosts_dir() -> Path:
    """``<cache dir>/hosts``, created private to the user (0700). Raises ModelHostError when it
    is not a directory owned by this user."""
    from .local_llm import cache_dir

    path = cache_dir() / "hosts"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
        if info.st_uid != os.getuid():
            raise ModelHostError(f"{path} belongs to another user")
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise ModelHostError(f"cannot create the model host directory {path}: {exc}") from exc
    return path


@dataclass(frozen=True)
class HostPaths:
    socket: Path
    clients: Path
    lock: Path
    log: Path

    @classmethod
    def of(cls, spec: HostSpec, directory: Optional[Path] = None) -> "HostPaths":
        base = (directory or hosts_dir()) / spec.key
        return cls(Path(f"{base}.sock"), Path(f"{base}.clients"), Path(f"{base}.lock"), Path(f"{base}.log"))


def _last_line(path: Path) -> str:
    """The last non-empty line of a host's log (its error, when it failed to start)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in handle.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"


def describe_exit(code: Optional[int]) -> str:
    """``killed by SIGKILL`` / ``exited with status 3`` for a Popen return code."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"
