"""Model backends behind two protocols: :class:`ChatModel` and :class:`Embedder`.

:func:`build_models` turns :class:`~relevancy_tracer.config.Settings` into a backend pair.
Local models run in the model host (:mod:`.host`, one process per user and model set on the
machine) unless ``local_host`` is false; then they run in this process, shared process-wide
per (model, threads, context), so reconfiguring never loads a second copy of a 1 GB model.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .. import _fork
from ..config import Settings
from .base import ChatModel, ChatReply, Embedder, EmbeddingReply, ModelError, Models

__all__ = ["ChatModel", "ChatReply", "Embedder", "EmbeddingReply", "ModelError", "Models", "build_models", "host_connection", "shared_local_embedder", "shared_local_llm"]

_shared: dict[tuple, Any] = {}
_shared_lock = threading.Lock()


@_fork.after_fork
def _renew_lock() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


def _shared_instance(key: tuple, factory: Any) -> Any:
    with _shared_lock:
        instance = _shared.get(key)
        if instance is None:
            instance = _shared[key] = factory()
        return instance


def shared_local_llm(model: str = "qwen2.5-coder-1.5b", threads: Optional[int] = None, n_ctx: int = 8192, repack: str = "auto") -> Any:
    """The process-wide :class:`~relevancy_tracer.models.local_llm.LocalChatModel` for these
    arguments (loaded lazily, once; an app can generate with the model the scorer uses)."""
    from .local_llm import LocalChatModel

    return _shared_instance(("local-llm", model, threads, n_ctx, repack), lambda: LocalChatModel(model, threads=threads, n_ctx=n_ctx, repack=repack))


def shared_local_embedder(model: str = "use-multilingual-v3") -> Any:
    """The process-wide local embedder ``model`` (see ``local_embed.LOCAL_EMBEDDERS``)."""
    from .local_embed import make_local_embedder

    return _shared_instance(("local-embed", model), lambda: make_local_embedder(model))


def host_spec(settings: Settings) -> Any:
    """The :class:`~.host.HostSpec` of the local models of ``settings`` (the chat model when
    ``llm`` is local, the embedder when ``embeddings`` is): one host serves both.

    ``local_host_nice`` 19, the lowest niceness and the default, also puts the host under
    ``SCHED_IDLE`` where the OS allows it (see ``host.lower_priority``); 0-18 set the niceness
    alone."""
    from .host import HostSpec

    local_llm = settings.llm == "local"
    return HostSpec(
        llm=settings.resolved_llm_model if local_llm else None,
        threads=settings.local_threads if local_llm else None,
        n_ctx=settings.local_context if local_llm else 8192,
        repack=settings.local_repack if local_llm else "auto",
        embedder=settings.resolved_embedding_model if settings.embeddings == "local" else None,
        nice=settings.local_host_nice,
        idle_timeout=settings.local_host_idle_timeout,
        sched_idle=settings.local_host_nice >= 19,
    )


def host_connection(settings: Settings) -> Any:
    """The process-wide :class:`~.host.HostConnection` to the model host of ``settings``
    (nothing starts here: the host starts on the first request)."""
    from .host import HostConnection
    from .local_llm import cache_dir

    spec = host_spec(settings)
    return _shared_instance(("host", spec, str(cache_dir())), lambda: HostConnection(spec))


def build_llm(settings: Settings) -> ChatModel:
    """The chat backend for ``settings`` (no network or model load happens here)."""
    if settings.llm == "local" and settings.local_host:
        from .host import HostChatModel

        return HostChatModel(host_connection(settings))
    if settings.llm == "local":
        return shared_local_llm(settings.resolved_llm_model, settings.local_threads, settings.local_context, settings.local_repack)
    from .openai_compat import OpenAIChatModel

    return OpenAIChatModel(
        settings.resolved_llm_model,
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
        response_format=settings.llm_response_format,
    )


def build_embedder(settings: Settings) -> Embedder:
    """The embeddings backend for ``settings`` (lazy: nothing loads here)."""
    if settings.embeddings == "local" and settings.local_host:
        from .host import HostEmbedder

        return HostEmbedder(host_connection(settings))
    if settings.embeddings == "local":
        return shared_local_embedder(settings.resolved_embedding_model)
    from .openai_compat import OpenAIEmbedder

    return OpenAIEmbedder(
        settings.resolved_embedding_model,
        base_url=settings.resolved_embedding_base_url,
        api_key=settings.resolved_embedding_api_key,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
    )


def build_models(settings: Settings) -> Models:
    """Both backends for ``settings``."""
    return Models(llm=build_llm(settings), embedder=build_embedder(settings))
