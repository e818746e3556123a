"""Settings: argument > RELEVANCY_TRACER_* environment > default; bad env warns, bad argument raises."""

from __future__ import annotations

import logging

import pytest

from relevancy_tracer import cli
from relevancy_tracer.config import EVALUATION_OVERRIDES, FIELDS, MODEL_FIELDS, Settings, settings_table, with_settings_table

from .conftest import ROOT


def test_defaults():
    settings = Settings.resolve(environ={})
    assert settings.strictness == 3 and settings.noncommittal == "per_question" and settings.generation == "joint"
    assert settings.method == "ragas_judge_intent"
    assert settings.thresholds is None and settings.calibration == "auto" and settings.attach == "answer_span" and settings.hold_timeout == 60.0


def test_environment_overrides_default_and_argument_overrides_environment():
    env = {"RELEVANCY_TRACER_STRICTNESS": "5", "RELEVANCY_TRACER_NONCOMMITTAL": "any", "RELEVANCY_TRACER_CAPTURE_CONTENT": "false"}
    from_env = Settings.resolve(environ=env)
    assert from_env.strictness == 5 and from_env.noncommittal == "any" and from_env.capture_content is False
    assert Settings.resolve(environ=env, strictness=2).strictness == 2


def test_openai_api_key_fallback_and_embedding_derivations():
    settings = Settings.resolve(environ={"OPENAI_API_KEY": "sk-env", "RELEVANCY_TRACER_LLM": "openai", "RELEVANCY_TRACER_EMBEDDINGS": "openai", "RELEVANCY_TRACER_LLM_BASE_URL": "http://h/v1"})
    assert settings.llm_api_key == "sk-env" and settings.resolved_embedding_api_key == "sk-env"
    assert settings.resolved_embedding_base_url == "http://h/v1"
    assert Settings.resolve(environ={"OPENAI_API_KEY": "sk-env", "RELEVANCY_TRACER_LLM_API_KEY": "sk-mine"}).llm_api_key == "sk-mine"


@pytest.mark.parametrize(
    "name, value",
    [("RELEVANCY_TRACER_STRICTNESS", "three"), ("RELEVANCY_TRACER_STRICTNESS", "0"), ("RELEVANCY_TRACER_METHOD", "magic"), ("RELEVANCY_TRACER_SAMPLE_RATIO", "1.5"), ("RELEVANCY_TRACER_ENABLED", "maybe"), ("RELEVANCY_TRACER_THRESHOLDS", "0.1,0.5")],
)
def test_bad_environment_value_warns_and_falls_back(caplog, name, value):
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        settings = Settings.resolve(environ={name: value})
    default = Settings.resolve(environ={})
    field = name.removeprefix("RELEVANCY_TRACER_").lower()
    assert getattr(settings, field) == getattr(default, field)
    assert name in caplog.text and "ignoring" in caplog.text


@pytest.mark.parametrize(
    "kwargs, error",
    [({"strictness": 0}, ValueError), ({"strictness": "3"}, TypeError), ({"method": "magic"}, ValueError), ({"sample_ratio": 2.0}, ValueError), ({"enabled": "yes"}, TypeError), ({"thresholds": (0.4, 0.6, 0.8)}, ValueError), ({"sampler": 3}, TypeError), ({"unknown_setting": 1}, TypeError), ({"combined_weights": {"ragas": -1}}, ValueError)],
)
def test_bad_argument_raises(kwargs, error):
    with pytest.raises(error):
        Settings.resolve(environ={}, **kwargs)


def test_replace_validates_and_settings_are_frozen():
    settings = Settings.resolve(environ={})
    assert settings.replace(strictness=4).strictness == 4
    with pytest.raises(ValueError):
        settings.replace(strictness=-1)
    with pytest.raises(AttributeError):
        settings.strictness = 4  # type: ignore[misc]


def test_combined_weights_from_env_and_mapping():
    assert Settings.resolve(environ={"RELEVANCY_TRACER_COMBINED_WEIGHTS": "ragas=0.5,direct=0.5"}).combined_weights == (("ragas", 0.5), ("direct", 0.5))
    assert Settings.resolve(environ={}, combined_weights={"ragas": 1, "intent": 2}).combined_weights == (("ragas", 1), ("intent", 2))


def test_docs_configuration_table_matches_the_settings():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert settings_table() in page, "docs/configuration.md's table is stale: paste relevancy_tracer.config.settings_table()"
    for spec in FIELDS:
        if spec.env:
            assert spec.env in page


def test_docs_configuration_table_is_generated_from_the_declarations():
    path = ROOT / "docs" / "configuration.md"
    text = path.read_text(encoding="utf-8")
    assert with_settings_table(text) == text, "docs/configuration.md is stale: relevancy-tracer settings-table --write docs/configuration.md"
    assert cli.main(["settings-table", "--check", str(path)]) == 0


def test_settings_table_command_finds_and_rewrites_a_stale_table(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- settings-table -->\n| old |\n<!-- /settings-table -->\nend\n", encoding="utf-8")
    assert cli.main(["settings-table", "--check", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert cli.main(["settings-table", "--write", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == "intro\n<!-- settings-table -->\n" + settings_table() + "\n<!-- /settings-table -->\nend\n"
    assert cli.main(["settings-table", "--check", str(page)]) == 0
    page.write_text("no markers", encoding="utf-8")
    assert cli.main(["settings-table", "--write", str(page)]) == 2  # a page without the markers is an error, not rewritten
    assert page.read_text(encoding="utf-8") == "no markers"


def test_every_setting_is_one_field_with_its_declaration():
    names = [spec.name for spec in FIELDS]
    assert names == list(Settings.__dataclass_fields__) and len(set(names)) == len(names)
    for spec in FIELDS:
        assert spec.env in (None, "RELEVANCY_TRACER_" + spec.name.upper())
        assert (spec.env is None) == (spec.parse is None)  # callables are argument only
    # the derived role lists hold declared names; a per-call override is never a model setting
    # (overriding one per call would build other backends for a decorated function)
    assert set(MODEL_FIELDS) <= set(names) and not set(MODEL_FIELDS) & set(EVALUATION_OVERRIDES)


def test_a_setting_declared_with_a_normaliser_accepts_the_other_forms():
    settings = Settings.resolve(environ={}, llm_timeout=5, thresholds=[0.9, 0.5, 0.1], rate_limit=0)
    assert isinstance(settings.llm_timeout, float) and settings.thresholds == (0.9, 0.5, 0.1) and settings.rate_limit is None
    assert Settings.resolve(environ={"RELEVANCY_TRACER_RATE_LIMIT": "0"}).rate_limit is None
    assert Settings.resolve(environ={"RELEVANCY_TRACER_THRESHOLDS": "0.9;0.5,0.1"}).thresholds == (0.9, 0.5, 0.1)


@pytest.mark.parametrize("override", EVALUATION_OVERRIDES)
def test_every_evaluation_override_is_accepted_by_trace(override):
    import relevancy_tracer

    value = {"thresholds": (0.9, 0.5, 0.1), "combined_weights": (("direct", 1.0),), "calibration": "none"}.get(override, getattr(Settings(), override))
    assert callable(relevancy_tracer.trace(lambda question: "answer", **{override: value}))  # validated at decoration
    with pytest.raises((TypeError, ValueError)):
        relevancy_tracer.trace(lambda question: "answer", **{override: object()})


def test_a_model_setting_is_not_a_per_call_override():
    import relevancy_tracer

    with pytest.raises(TypeError, match="unknown trace option"):
        relevancy_tracer.trace(lambda question: "answer", llm_model="other")


# ------------------------------------------------------------------------------ weight repacking

AMX_CPUINFO = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 avx512_fp16 amx_tile amx_int8\n"
PLAIN_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 7763\nflags\t\t: fpu sse2 avx2 fma\n"


def test_weight_repacking_is_off_where_the_cpu_reports_amx():
    from relevancy_tracer.models.local_llm import cpu_flags, repack_weights

    assert {"amx_tile", "amx_int8"} <= cpu_flags(AMX_CPUINFO) and cpu_flags(PLAIN_CPUINFO) == {"fpu", "sse2", "avx2", "fma"}
    assert repack_weights("auto", flags=cpu_flags(AMX_CPUINFO), system_info="CPU : AVX2 = 1 | REPACK = 1 |") is False
    assert repack_weights("auto", flags=cpu_flags(PLAIN_CPUINFO), system_info="CPU : AVX2 = 1 | REPACK = 1 |") is True
    # a ggml build compiled for AMX on another machine, running where cpuinfo hides the flags
    assert repack_weights("auto", flags=frozenset(), system_info="CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |") is False
    assert cpu_flags("no flags line here") == frozenset()
    assert repack_weights("on", flags=cpu_flags(AMX_CPUINFO)) is True
    assert repack_weights("off", flags=cpu_flags(PLAIN_CPUINFO), system_info="") is False
    with pytest.raises(ValueError):
        repack_weights("sometimes")


def test_local_repack_setting_reaches_the_model(monkeypatch):
    from relevancy_tracer.scoring.backends import build_llm

    monkeypatch.setenv("RELEVANCY_TRACER_LOCAL_REPACK", "off")
    settings = Settings.resolve(llm="local")
    assert settings.local_repack == "off" and build_llm(settings).connection.spec.repack == "off"  # the model host's
    assert build_llm(settings.replace(local_host=False))._repack == "off"  # in process
    monkeypatch.setenv("RELEVANCY_TRACER_LOCAL_REPACK", "maybe")
    assert Settings.resolve().local_repack == "auto"  # a bad environment value warns and falls back


# ------------------------------------------------------------------------------ issue 35, item 8

_ENV_FIELDS = [spec for spec in FIELDS if spec.env is not None]


def _env_values():
    from hypothesis import strategies as st

    digits = st.integers(min_value=1, max_value=5000).map(lambda n: "9" * n)
    numbers = st.one_of(st.integers().map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr), digits, digits.map(lambda d: "-" + d), digits.map(lambda d: d + ".5"), digits.map(lambda d: "1e" + d[:6]))
    return st.one_of(numbers, st.text(max_size=50), st.lists(numbers, min_size=1, max_size=4).map(",".join), st.builds(lambda n, w: f"{n}={w}", st.sampled_from(["ragas", "direct", "x"]), numbers))


def test_no_environment_value_makes_resolving_raise():
    """Issue 35, item 8: any string in any setting's variable (a 400-digit integer, 1e999,
    text) resolves, warning and falling back to the default when it is not valid; never an
    OverflowError or any other exception."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

    default = Settings.resolve(environ={})

    @hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=st.sampled_from(_ENV_FIELDS), raw=_env_values())
    def resolves(spec, raw):
        resolved = Settings.resolve(environ={spec.env: raw})
        value = getattr(resolved, spec.name)
        if value != getattr(default, spec.name):
            spec.check(spec.name, value)  # taken: a valid value

    resolves()
    assert Settings.resolve(environ={"RELEVANCY_TRACER_QUEUE_SIZE": "9" * 400}).queue_size == default.queue_size


def test_configure_never_raises_for_a_huge_integer_in_the_environment(tracing, monkeypatch, caplog):
    monkeypatch.setenv("RELEVANCY_TRACER_QUEUE_SIZE", "9" * 400)
    monkeypatch.setenv("RELEVANCY_TRACER_MAX_CONTEXT_CHARS", "1" + "0" * 400)
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        settings = tracing()
    assert settings.queue_size == 1000 and settings.max_context_chars == 32000
    assert "RELEVANCY_TRACER_QUEUE_SIZE" in caplog.text and "400 characters" in caplog.text


def test_every_receiver_setting_the_validator_accepts_starts_the_servers(monkeypatch):
    """Issue 35, item 8: the largest values the settings accept are values grpcio and aiohttp
    take (gRPC's options are 32-bit); one past them is refused with a warning, not a crash."""
    from relevancy_tracer.service import ScoringService

    for name in ("TRACES", "LOGS", "METRICS"):
        monkeypatch.setenv(f"OTEL_{name}_EXPORTER", "none")
    largest = {"RELEVANCY_TRACER_MAX_REQUEST_BYTES": str(2**31 - 1), "RELEVANCY_TRACER_RECEIVER_IDLE_TIMEOUT": "86400", "RELEVANCY_TRACER_RECEIVER_BODY_TIMEOUT": "86400", "RELEVANCY_TRACER_RECEIVER_MAX_CONNECTIONS": "1000000", "RELEVANCY_TRACER_RECEIVER_MAX_INFLIGHT": "1024", "RELEVANCY_TRACER_QUEUE_SIZE": "10000000"}
    past = {"RELEVANCY_TRACER_MAX_REQUEST_BYTES": str(2**31), "RELEVANCY_TRACER_RECEIVER_IDLE_TIMEOUT": "250000", "RELEVANCY_TRACER_RECEIVER_BODY_TIMEOUT": "1e300"}
    for env in (largest, past):
        settings = Settings.resolve(environ=dict(env, RELEVANCY_TRACER_LLM="openai", RELEVANCY_TRACER_EMBEDDINGS="openai"))
        if env is largest:
            assert settings.max_request_bytes == 2**31 - 1 and settings.receiver_idle_timeout == 86400
        service = ScoringService(settings, http_port=0, grpc_port=0).start()
        try:
            assert service.server.http_port and service.server.grpc_port
        finally:
            service.stop(5.0)
