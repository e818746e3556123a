"""The public API is the one the documentation teaches: every name of ``relevancy_tracer.__all__``
and of ``relevancy_tracer.samplers.__all__`` is in the README, the docs or the examples; the
examples import public modules only; the sampler classes moved out of the top level still import
from there, with a DeprecationWarning."""

from __future__ import annotations

import ast
import re
import warnings

import pytest

import relevancy_tracer
from relevancy_tracer import samplers
from relevancy_tracer_testing import use_scripted_host_models

from .conftest import ROOT

#: The modules an example (or a user) may import: the package and its public submodules.
PUBLIC_MODULES = {"relevancy_tracer", "relevancy_tracer.samplers"}
#: What the documentation teaches: the README, the docs site and the examples.
TAUGHT = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]


def _taught_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in TAUGHT)


def test_every_exported_name_is_taught_and_importable():
    text = _taught_text()
    untaught = [name for name in relevancy_tracer.__all__ if not re.search(rf"(?<![\w.]){re.escape(name)}\b", text)]
    assert untaught == []
    # the public API table names each export, so a new export needs a line there
    api = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## The public API", 1)[1]
    assert [name for name in relevancy_tracer.__all__ if f"`{name}" not in api] == []
    for name in relevancy_tracer.__all__:
        getattr(relevancy_tracer, name)


def test_the_samplers_have_a_public_module_of_their_own():
    tracing_doc = (ROOT / "docs" / "tracing.md").read_text(encoding="utf-8")
    assert [name for name in samplers.__all__ if f"`{name}" not in tracing_doc] == []
    moved = ["AllOf", "AlwaysOff", "AlwaysOn", "CallableSampler", "RateLimitSampler", "TraceIdRatioSampler"]
    assert not set(moved) & set(relevancy_tracer.__all__)
    namespace: dict = {}
    exec("from relevancy_tracer import *", namespace)
    assert not set(moved) & set(namespace) and "SamplingContext" in namespace
    for name in moved:  # still importable from the top level, with a warning
        with pytest.warns(DeprecationWarning, match=f"relevancy_tracer.{name} is deprecated"):
            assert getattr(relevancy_tracer, name) is getattr(samplers, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert samplers.SamplingContext is relevancy_tracer.SamplingContext
    with pytest.raises(AttributeError):
        relevancy_tracer.NoSuchSampler  # noqa: B018


def test_the_documented_custom_sampler_is_accepted_and_decides_per_function():
    tenth = samplers.TraceIdRatioSampler(0.1)

    def sampler(context: samplers.SamplingContext) -> bool:
        return context.span_name != "search.answer" or tenth.should_sample(context)

    settings = relevancy_tracer.Settings.resolve(sampler=sampler)
    assert settings.sampler is sampler
    low, high = 1, (1 << 64) - 1  # lower 64 bits under and over a tenth of 2**64
    assert sampler(samplers.SamplingContext(high, "other.answer"))
    assert sampler(samplers.SamplingContext(low, "search.answer"))
    assert not sampler(samplers.SamplingContext(high, "search.answer"))


def _imported_modules(path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_the_examples_import_public_modules_only(path):
    ours = {m for m in _imported_modules(path) if m == "relevancy_tracer" or m.startswith("relevancy_tracer.")}
    assert ours <= PUBLIC_MODULES, ours - PUBLIC_MODULES


def test_the_local_models_for_the_apps_own_use_come_from_the_model_host(tmp_path, monkeypatch):
    """``local_embedder`` and ``local_chat_model`` give the model host's models (here the
    scripted ones: no model is loaded), as the example RAG app uses them."""
    use_scripted_host_models()
    monkeypatch.setenv("RELEVANCY_TRACER_CACHE_DIR", str(tmp_path / "cache"))  # a host of this test's own
    monkeypatch.setenv("RELEVANCY_TRACER_LOCAL_HOST_IDLE_TIMEOUT", "1")
    monkeypatch.setenv("RELEVANCY_TRACER_LLM", "local")
    monkeypatch.setenv("RELEVANCY_TRACER_LLM_MODEL", "fake-host-chat")
    monkeypatch.setenv("RELEVANCY_TRACER_EMBEDDINGS", "local")
    monkeypatch.setenv("RELEVANCY_TRACER_EMBEDDING_MODEL", "fake-host-embed")
    embedder = relevancy_tracer.local_embedder("fake-host-embed")
    try:
        vectors = embedder.embed_sync(["Where is Paris?", "Paris is in France."])
        assert embedder.name == "fake-host-embed" and vectors.shape[0] == 2 and vectors.shape[1] > 0
        chat = relevancy_tracer.local_chat_model("fake-host-chat")
        assert type(chat).__name__ == "HostChatModel" and callable(chat.generate)
    finally:
        embedder.connection.close()  # the host exits once its last client has gone
