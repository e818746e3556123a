"""Building the model backends a configuration asks for.

:func:`build_models` turns :class:`~relevancy_tracer.config.Settings` into a
:class:`~relevancy_tracer.models.base.Models` pair. Local models run in the model host
(:mod:`relevancy_tracer.models.host`) unless ``local_host`` is false; then they run in this
process, shared process-wide (:func:`~relevancy_tracer.models.shared_local_llm`). Nothing is
loaded or contacted here: backends are lazy.
"""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..models import shared_instance, shared_local_embedder, shared_local_llm
from ..models.base import ChatModel, Embedder, Models


def host_spec(settings: Settings) -> Any:
    """The :class:`~relevancy_tracer.models.host.HostSpec` of the local models of ``settings`` (the chat model when
    ``llm`` is local, the embedder when ``embeddings`` is): one host serves both.

    ``local_host_nice`` 19, the lowest niceness and the default, also puts the host under
    ``SCHED_IDLE`` where the OS allows it (see ``models.host.lower_priority``); 0-18 set the
    niceness alone."""
    from ..models.host import HostSpec

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
    """The process-wide :class:`~relevancy_tracer.models.host.HostConnection` to the model host of ``settings``
    (nothing starts here: the host starts on the first request)."""
    from ..models.host import HostConnection
    from ..models.local_llm import cache_dir

    spec = host_spec(settings)
    return shared_instance(("host", spec, str(cache_dir())), lambda: HostConnection(spec))


def build_llm(settings: Settings) -> ChatModel:
    """The chat backend for ``settings`` (no network or model load happens here)."""
    if settings.llm == "local" and settings.local_host:
        from ..models.host import HostChatModel

        return HostChatModel(host_connection(settings))
    if settings.llm == "local":
        return shared_local_llm(settings.resolved_llm_model, settings.local_threads, settings.local_context, settings.local_repack)
    from ..models.openai_compat import OpenAIChatModel

    return OpenAIChatModel(
        settings.resolved_llm_model,
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
        response_format=settings.llm_response_format,
        max_reply_bytes=settings.llm_max_reply_bytes,
    )


def build_embedder(settings: Settings) -> Embedder:
    """The embeddings backend for ``settings`` (lazy: nothing loads here)."""
    if settings.embeddings == "local" and settings.local_host:
        from ..models.host import HostEmbedder

        return HostEmbedder(host_connection(settings))
    if settings.embeddings == "local":
        return shared_local_embedder(settings.resolved_embedding_model)
    from ..models.openai_compat import OpenAIEmbedder

    return OpenAIEmbedder(
        settings.resolved_embedding_model,
        base_url=settings.resolved_embedding_base_url,
        api_key=settings.resolved_embedding_api_key,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_max_retries,
        max_reply_bytes=settings.llm_max_reply_bytes,
    )


def build_models(settings: Settings) -> Models:
    """Both backends for ``settings``."""
    return Models(llm=build_llm(settings), embedder=build_embedder(settings))
