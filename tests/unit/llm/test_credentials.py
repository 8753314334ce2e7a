"""Keys and provider resolution (host/llm/credentials.py) through the broker: `.env` parsed, never executed
nor exported, the environment first, agent-config.json per agent under the host's pins, and no key ever
shown."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from host.core.errors import ConfigError
from host.llm.broker import LlmBroker
from host.llm.credentials import MAX_ENV_FILE_BYTES, parse_env_text, read_env_file
from host.llm.providers import Completion
from host.runtime.backends.hostproc import HostSpec, host_wrapper_env
from host.runtime.rundir import RunDir
from host.spec.config import AgentLlmConfig, LlmHostConfig
from host.tools.workers import _worker_env
from tests.support.fake_llm import SECRET_IN_ERROR_BODY, Behaviour, FakeLlmServer
from tests.unit.llm._support import AGENT_KEY, CANARY, MESSAGES, agents_host, drain, env_for, grant, refusal


def test_openai_compatible_uses_the_configured_url_and_a_dummy_key(srv: FakeLlmServer) -> None:
    broker = LlmBroker(
        LlmHostConfig(provider="openai_compatible", base_url=srv.base_url_openai, model="llama3"), env={}
    )
    assert broker.describe() == {
        "provider": "openai_compatible", "model": "llama3", "configured": True,
        "provider_source": "host config", "key_variable": "OPENAI_API_KEY", "key_source": None,
        "unavailable": None,
    }  # fmt: skip
    assert broker.session(grant(max_output_chars=30)).call(MESSAGES).content == "fake reply"
    [req] = srv.requests
    assert req.headers["authorization"] == "Bearer not-needed"
    assert req.body["model"] == "llama3"
    assert req.body["max_tokens"] == 10
    assert "max_completion_tokens" not in req.body


def test_openai_compatible_takes_key_and_url_from_env(srv: FakeLlmServer) -> None:
    env = {"OPENAI_API_KEY": CANARY, "OPENAI_BASE_URL": srv.base_url_openai}
    LlmBroker(LlmHostConfig(provider="openai_compatible"), env=env).session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {CANARY}"


def test_openai_compatible_without_a_url_is_unconfigured() -> None:
    broker = LlmBroker(LlmHostConfig(provider="openai_compatible"), env={})
    assert broker.describe()["configured"] is False
    assert refusal(broker.session(grant()).call, MESSAGES).reason == "LLM_UNAVAILABLE"


@pytest.mark.parametrize(
    ("keys", "configured_provider", "expected"),
    [
        ({"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}, None, "openai"),
        ({"ANTHROPIC_API_KEY"}, None, "anthropic"),
        ({"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}, "anthropic", "anthropic"),
    ],
)
def test_provider_selection(
    keys: set[str], configured_provider: str | None, expected: str, srv: FakeLlmServer
) -> None:
    env = {k: CANARY for k in keys} | {
        "OPENAI_BASE_URL": srv.base_url_openai,
        "ANTHROPIC_BASE_URL": srv.base_url_anthropic,
    }
    broker = LlmBroker(LlmHostConfig(provider=configured_provider), env=env)
    assert broker.describe()["provider"] == expected
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].path == ("/v1/chat/completions" if expected == "openai" else "/v1/messages")


def test_no_provider_refuses_without_charging_a_call() -> None:
    broker = LlmBroker(LlmHostConfig(), env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    described = broker.describe()
    assert {k: described[k] for k in ("provider", "model", "configured", "key_source")} == {
        "provider": None, "model": None, "configured": False, "key_source": None,
    }  # fmt: skip
    assert "no LLM provider" in described["unavailable"]
    sess = broker.session(grant())
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert sess.usage()["provider_errors"] == 1
    assert sess.calls_remaining == 5


# --- .env and agent-config.json ---------------------------------------------------------------------


FILE_KEY = "sk-from-dotenv-FILE-41"


def test_env_text_is_parsed_like_dotenv(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "# a comment\n"
        "\n"
        "PLAIN=abc\n"
        "export EXPORTED=yes\n"
        "  SPACED  =  padded value  \n"
        "SINGLE='literal \\n #not a comment $HOME' # a comment\n"
        'DOUBLE="line\\nnext \\"q\\" \\\\ \\x # kept"\n'
        "INLINE=value # comment\n"
        "HASH=a#b\n"
        "EMPTY=\n"
        "QUOTED_EMPTY=''\n"
        "EXPAND=$PLAIN${PLAIN}\n"
        "DUP=first\r\n"
        "DUP=second\r"
        "export=word\n"
        "  # indented comment\n"
    )
    assert parse_env_text(text, ".env") == {
        "PLAIN": "abc",
        "EXPORTED": "yes",
        "SPACED": "padded value",
        "SINGLE": "literal \\n #not a comment $HOME",
        "DOUBLE": 'line\nnext "q" \\ \\x # kept',
        "INLINE": "value",
        "HASH": "a#b",
        "EMPTY": "",
        "QUOTED_EMPTY": "",
        "EXPAND": "$PLAIN${PLAIN}",  # nothing is expanded
        "DUP": "second",
        "export": "word",
    }
    assert caplog.records == []


def test_malformed_env_lines_are_ignored_with_a_warning_that_never_shows_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    text = (
        "GOOD=1\n"
        f"{CANARY}\n"  # no '='
        f"1BAD={CANARY}\n"  # not a name
        f"OPEN='{CANARY}\n"  # unclosed quote: a value never spans lines
        f'AFTER="{CANARY}"junk\n'  # text after the closing quote
        f"export {CANARY}\n"
        f"$(echo {CANARY})=x\n"  # never executed
        "ALSO_GOOD = 2\n"
    )
    assert parse_env_text(text, "/cfg/.env") == {"GOOD": "1", "ALSO_GOOD": "2"}
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "/cfg/.env: ignored 6 line(s) that are not KEY=VALUE (line 2, 3, 4, 5, 6, 7)"
    )
    assert CANARY not in caplog.text


def write_env_file(directory: Path, text: str, mode: int = 0o600) -> Path:
    path = directory / ".env"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_env_file_is_read_bounded_and_refused_when_too_large(tmp_path: Path) -> None:
    assert read_env_file(tmp_path / "missing") == {}
    path = write_env_file(tmp_path, "\ufeffA=1\n" + "# pad\n" * ((MAX_ENV_FILE_BYTES - 10) // 6))
    assert path.stat().st_size <= MAX_ENV_FILE_BYTES
    assert read_env_file(path) == {"A": "1"}  # a UTF-8 BOM is fine
    path.write_text("A=" + "x" * MAX_ENV_FILE_BYTES, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_env_file(path)
    assert str(info.value) == f"{path}: the .env file is larger than {MAX_ENV_FILE_BYTES} bytes"
    assert "xxxx" not in info.value.hint


def test_env_file_that_is_not_text_or_not_a_file_is_refused_without_showing_it(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_bytes(b"OPENAI_API_KEY=" + CANARY.encode() + b"\xff\xfe\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=r"\.env: the \.env file is not UTF-8 text$") as info:
        read_env_file(path)
    assert CANARY not in str(info.value) + info.value.hint
    assert info.value.__cause__ is None and info.value.__context__ is None
    path.unlink()
    os.mkfifo(path)  # a FIFO would block a plain open(); it is refused without waiting for a writer
    with pytest.raises(ConfigError, match="not a regular file"):
        read_env_file(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        read_env_file(path)


@pytest.mark.parametrize(("mode", "warned"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True),
                                              (0o620, True)])  # fmt: skip
def test_env_file_open_to_others_is_used_with_a_warning(
    mode: int, warned: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_env_file(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n", mode)
    assert read_env_file(path) == {"OPENAI_API_KEY": FILE_KEY}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == ([f"{path} is readable or writable by group or others (mode {mode:o}): run chmod 600 "
                         f"{path}"] if warned else [])  # fmt: skip
    assert FILE_KEY not in caplog.text


def dotenv_host(tmp_path: Path, text: str, **host: Any) -> LlmHostConfig:
    env_file = write_env_file(tmp_path, text)
    return LlmHostConfig(env_file=env_file, agent_config_file=tmp_path / "ac.json", **host)


def test_dotenv_supplies_keys_and_urls_the_environment_lacks(tmp_path: Path, srv: FakeLlmServer) -> None:
    text = f"export OPENAI_API_KEY='{FILE_KEY}'\nOPENAI_BASE_URL={srv.base_url_openai}\n"
    host = dotenv_host(tmp_path, text)
    broker = LlmBroker(host, env={})
    described = broker.describe()
    assert described["configured"] is True
    assert (described["key_variable"], described["key_source"]) == ("OPENAI_API_KEY", ".env")
    assert FILE_KEY not in repr(described)
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {FILE_KEY}"


def test_the_environment_wins_over_dotenv(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n")
    broker = LlmBroker(host, env=env_for("openai", srv))
    assert broker.describe()["key_source"] == "env"
    broker.session(grant()).call(MESSAGES)
    assert srv.requests[0].headers["authorization"] == f"Bearer {CANARY}"  # and the env's URL was used


def test_an_empty_environment_variable_counts_as_unset(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n")
    broker = LlmBroker(host, env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": srv.base_url_openai})
    assert broker.describe()["key_source"] == ".env"


def test_dotenv_drives_auto_detection_in_the_sdk_order(tmp_path: Path, srv: FakeLlmServer) -> None:
    host = dotenv_host(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\n")
    described = LlmBroker(host, env={"ANTHROPIC_API_KEY": CANARY}).describe()
    assert (described["provider"], described["provider_source"], described["key_source"]) == (
        "openai", "auto-detect", ".env"
    )


def test_dotenv_never_reaches_os_environ_or_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, srv: FakeLlmServer
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "MY_AGENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    text = f"OPENAI_API_KEY={FILE_KEY}\nMY_AGENT_KEY={AGENT_KEY}\nOPENAI_BASE_URL={srv.base_url_openai}\n"
    host = dotenv_host(tmp_path, text, agents={"a": AgentLlmConfig("openai", api_key_env="MY_AGENT_KEY")})
    broker = LlmBroker(host)  # the real process environment
    broker.session(grant(), slug="a").call(MESSAGES)
    broker.session(grant()).call(MESSAGES)
    assert [r.headers["authorization"] for r in srv.requests] == [f"Bearer {AGENT_KEY}", f"Bearer {FILE_KEY}"]
    assert dict(os.environ) == before
    # What the host hands its children: a plain child, the host-path wrapper and a tool worker.
    child = subprocess.run(
        [sys.executable, "-c", "import os, sys; sys.stdout.write(repr(sorted(os.environ.items())))"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    wrapper = host_wrapper_env(RunDir(tmp_path), HostSpec(slug="a", import_root=str(tmp_path)), os.environ)
    for seen in (child.stdout, repr(wrapper), repr(_worker_env())):
        for secret in (FILE_KEY, AGENT_KEY, "MY_AGENT_KEY", srv.base_url):
            assert secret not in seen
    for secret in (FILE_KEY, AGENT_KEY):
        assert secret not in repr(vars(broker))


@pytest.mark.parametrize(
    ("slug", "path", "model", "key", "bound"),
    [
        (None, "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),  # auto-detect
        ("unlisted", "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),
        ("writer", "/v1/messages", "claude-writer", "sk-anthropic-K", "max_tokens"),
        ("coder", "/v1/chat/completions", "gpt-coder", AGENT_KEY, "max_completion_tokens"),
        ("router", "/v1/chat/completions", "meta/llama-x", "sk-or-K", "max_tokens"),
        ("plain", "/v1/chat/completions", "gpt-4o-mini", CANARY, "max_completion_tokens"),
    ],
)
def test_agent_config_picks_each_agents_provider_model_and_key(
    slug: str | None, path: str, model: str, key: str, *, bound: str, srv: FakeLlmServer
) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    sess = broker.session(grant(), slug=slug)
    assert sess.call(MESSAGES).content == "fake reply"
    assert drain(broker.session(grant(), slug=slug))[-1] == Completion("", "stop", 13, 10)
    for req in srv.requests:
        assert req.path == path
        assert req.body["model"] == model
        assert key in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
        assert bound in req.body
    assert sess.usage()["model"] == model
    described = broker.describe(slug)
    assert (described["provider_source"], described["model"]) == (
        "agent-config" if slug in ("writer", "coder", "router", "plain") else "auto-detect", model
    )
    assert described["key_variable"] == ("CODER_KEY" if slug == "coder" else described["key_variable"])


def test_openrouter_defaults_to_its_own_url() -> None:
    host = LlmHostConfig(agents={"r": AgentLlmConfig("openrouter")})
    broker = LlmBroker(host, env={"OPENROUTER_API_KEY": CANARY})
    assert broker._resolution("r").binding is not None
    assert broker._resolution("r").binding.base_url == "https://openrouter.ai/api/v1"  # type: ignore[union-attr]
    assert broker.describe("r")["model"] == "openai/gpt-4o-mini"


def test_host_pinned_provider_ignores_an_agent_config_for_another_provider(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, provider="anthropic")
    broker = LlmBroker(host, env=env)
    broker.session(grant(), slug="coder").call(MESSAGES)  # coder asks for openai, gpt-coder, CODER_KEY
    [req] = srv.requests
    assert req.path == "/v1/messages" and req.body["model"] == "claude-3-5-haiku-latest"
    assert "sk-anthropic-K" in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
    assert broker.describe("coder")["provider_source"] == "host config"
    assert broker.describe("gem")["configured"] is True  # gemini is never reached when the host pins


def test_host_pinned_provider_keeps_the_agents_model_and_key_for_that_provider(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, provider="openai")
    LlmBroker(host, env=env).session(grant(), slug="coder").call(MESSAGES)
    [req] = srv.requests
    assert (req.body["model"], req.headers["authorization"]) == ("gpt-coder", f"Bearer {AGENT_KEY}")


def test_host_pinned_model_and_url_win_over_agent_config(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv, model="host-model", base_url=srv.base_url_anthropic)
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # the host's base_url wins over the variable
    broker = LlmBroker(host, env=env)
    broker.session(grant(), slug="writer").call(MESSAGES)
    [req] = srv.requests
    assert (req.path, req.body["model"]) == ("/v1/messages", "host-model")


def test_allowed_models_apply_to_the_agent_config_model(srv: FakeLlmServer) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    sess = broker.session(grant(allowed_models=frozenset({"gpt-4o-mini"})), slug="writer")
    assert refusal(sess.call, MESSAGES).reason == "LLM_MODEL_NOT_ALLOWED"
    assert broker.session(grant(allowed_models=frozenset({"claude-writer"})), slug="writer").call(MESSAGES)
    assert len(srv.requests) == 1


def test_gemini_is_unavailable_with_a_clear_reason(
    srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    host, env = agents_host(srv)
    broker = LlmBroker(host, env=env)
    described = broker.describe("gem")
    assert (described["provider"], described["configured"]) == ("gemini", False)
    assert described["unavailable"] == (
        "provider gemini (agents.gem.llm in /cfg/agent-config.json) is not supported by the broker "
        "(no gemini SDK): choose openai, anthropic or openrouter there, or pin agent_sandbox.llm.provider"
    )
    sess = broker.session(grant(), slug="gem")
    assert refusal(sess.call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert (sess.usage()["provider_errors"], sess.calls_remaining) == (1, 5)
    assert described["unavailable"] in caplog.text
    assert srv.requests == []


def test_an_agent_configs_missing_key_never_falls_back_to_another_provider(
    tmp_path: Path, srv: FakeLlmServer
) -> None:
    agents = {"a": AgentLlmConfig("anthropic", api_key_env="NOPE")}
    host = LlmHostConfig(env_file=tmp_path / ".env", agents=agents)
    broker = LlmBroker(host, env=env_for("openai", srv))
    described = broker.describe("a")
    assert (described["provider"], described["configured"], described["key_variable"]) == (
        "anthropic", False, "NOPE"
    )
    assert described["unavailable"] == (
        f"no API key for anthropic: NOPE is set neither in the environment nor in {tmp_path / '.env'}"
    )
    assert refusal(broker.session(grant(), slug="a").call, MESSAGES).reason == "LLM_UNAVAILABLE"
    assert srv.requests == []
    assert broker.describe()["configured"] is True  # other agents still auto-detect openai


def test_no_key_from_any_source_leaks_into_describe_refusals_or_logs(
    tmp_path: Path, srv: FakeLlmServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host, env = agents_host(srv)
    env.pop("OPENAI_API_KEY")
    host = LlmHostConfig(
        env_file=write_env_file(tmp_path, f"OPENAI_API_KEY={FILE_KEY}\nbroken {FILE_KEY}\n", 0o644),
        agents=host.agents, agent_config_file=host.agent_config_file,
    )  # fmt: skip
    broker = LlmBroker(host, env=env)
    srv.default = Behaviour(status=500)
    seen: list[str] = []
    for slug in (None, "writer", "coder", "router", "gem", "plain"):
        seen.append(repr(broker.describe(slug)))
        sess = broker.session(grant(), slug=slug)
        exc = refusal(sess.call, MESSAGES)
        seen += [str(exc), repr(exc), exc.message, repr(sess.usage())]
    seen.append(caplog.text)
    for secret in (FILE_KEY, AGENT_KEY, CANARY, "sk-anthropic-K", "sk-or-K", SECRET_IN_ERROR_BODY):
        assert all(secret not in text for text in seen), secret


def test_a_provider_whose_sdk_is_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "anthropic" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    broker = LlmBroker(LlmHostConfig(), env={"ANTHROPIC_API_KEY": "sk-ant-test"})
    described = broker.describe()
    assert described["configured"] is False and described["provider"] == "anthropic"
    assert "pip install 'agentnode-sandbox[anthropic]'" in described["unavailable"]
    assert "sk-ant-test" not in repr(described)
    assert LlmBroker(LlmHostConfig(), env={"OPENAI_API_KEY": "sk-test"}).describe()["configured"] is True
