"""Model backends behind two protocols: :class:`ChatModel` and :class:`Embedder`.

OpenAI-compatible clients (:mod:`.openai_compat`), llama.cpp (:mod:`.local_llm`), local
embedders (:mod:`.local_embed`) and the model host (:mod:`.host`, one process per user and model
set on the machine). In-process local models are shared process-wide per (model, threads,
context) (:func:`shared_local_llm`), so reconfiguring never loads a second copy of a 1 GB model.
Which backends a configuration uses is decided in :mod:`relevancy_tracer.scoring.backends`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .._background import fork as _fork
from .base import ChatModel, ChatReply, Embedder, EmbeddingReply, ModelError, Models

__all__ = ["ChatModel", "ChatReply", "Embedder", "EmbeddingReply", "ModelError", "Models", "shared_instance", "shared_local_embedder", "shared_local_llm"]

_shared: dict[tuple, Any] = {}
_shared_lock = threading.Lock()


@_fork.after_fork
def _renew_lock() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


def shared_instance(key: tuple, factory: Any) -> Any:
    """The process-wide instance for ``key``, made by ``factory()`` on first use."""
    with _shared_lock:
        instance = _shared.get(key)
        if instance is None:
            instance = _shared[key] = factory()
        return instance


def shared_local_llm(model: str = "qwen2.5-coder-1.5b", threads: Optional[int] = None, n_ctx: int = 8192, repack: str = "auto") -> Any:
    """The process-wide :class:`~relevancy_tracer.models.local_llm.LocalChatModel` for these
    arguments (loaded lazily, once; an app can generate with the model the scorer uses)."""
    from .local_llm import LocalChatModel

    return shared_instance(("local-llm", model, threads, n_ctx, repack), lambda: LocalChatModel(model, threads=threads, n_ctx=n_ctx, repack=repack))


def shared_local_embedder(model: str = "use-multilingual-v3") -> Any:
    """The process-wide local embedder ``model`` (see ``local_embed.LOCAL_EMBEDDERS``)."""
    from .local_embed import make_local_embedder

    return shared_instance(("local-embed", model), lambda: make_local_embedder(model))
