"""The agentnode_sdk compatibility package: its names and signatures, both import paths, the host's worker."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sandbox_wrapper
from host.engine.recipe import _wrapper_sources
from host.spec.manifest.model import ToolpackManifest, ToolSpec
from host.tools.calls import InstalledToolpack
from host.tools.gate import ToolGate
from host.tools.workers import ToolRunner
from sandbox_wrapper._tool_exec import COMPAT_DIR
from tests.support.paths import REPO


def _drop_sdk_modules() -> None:
    for name in [n for n in sys.modules if n == "agentnode_sdk" or n.startswith("agentnode_sdk.")]:
        del sys.modules[name]


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """agentnode_sdk imported as in a sandbox (sandbox_wrapper is loaded here), and forgotten afterwards."""
    monkeypatch.setattr(sys, "path", [*sys.path, COMPAT_DIR])
    _drop_sdk_modules()
    import agentnode_sdk

    yield agentnode_sdk
    _drop_sdk_modules()


def _python(code: str, *path: str, isolated: bool = True) -> Any:
    """Run `code` in a fresh interpreter with `path` appended to sys.path; returns what it prints as JSON."""
    prelude = f"import json, sys\nsys.path.extend({list(path)!r})\n"
    cmd = [sys.executable, *(["-I"] if isolated else []), "-c", prelude + textwrap.dedent(code)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- names and signatures ---------------------------------------------------------------------------


def test_the_compat_package_is_the_documented_one_and_stdlib_only() -> None:
    assert Path(COMPAT_DIR) == REPO / "sandbox_wrapper" / "_compat"
    modules = sorted(p.relative_to(COMPAT_DIR).as_posix() for p in Path(COMPAT_DIR).rglob("*.py"))
    assert "agentnode_sdk/runtimes/agent_runner.py" in modules
    for path in Path(COMPAT_DIR).rglob("*.py"):
        source = path.read_text()
        assert ast.get_docstring(ast.parse(source)), f"{path} has no module docstring"
        for banned in ("socket", "urllib", "http", "requests", "httpx", "grpc", "subprocess"):
            assert f"import {banned}" not in source and f"from {banned}" not in source, (path, banned)


def test_top_level_names_match_the_sdk(sdk: ModuleType) -> None:
    from agentnode_sdk.exceptions import AgentNodeError, AgentNodeToolError
    from agentnode_sdk.models import RunToolResult

    assert sdk.ToolError is AgentNodeToolError is sdk.AgentNodeToolError
    assert sdk.AgentNodeError is AgentNodeError and sdk.RunToolResult is RunToolResult
    assert sdk.__version__.endswith("+agentnode-sandbox")
    assert set(sdk.__all__) >= {"ToolError", "AgentNodeToolError", "AgentNodeError", "RunToolResult"}
    assert all(hasattr(sdk, name) for name in sdk.__all__)


def test_exceptions_keep_the_sdk_signatures(sdk: ModuleType) -> None:
    from agentnode_sdk.exceptions import AgentNodeError, AgentNodeToolError, NotFoundError

    assert list(inspect.signature(AgentNodeToolError).parameters) == ["message", "tool_name", "details"]
    assert list(inspect.signature(AgentNodeError).parameters) == ["code", "message"]
    assert issubclass(AgentNodeToolError, Exception) and not issubclass(AgentNodeToolError, AgentNodeError)

    plain = AgentNodeToolError("bad input")
    assert (str(plain), plain.tool_name, plain.details) == ("bad input", None, {})
    full = AgentNodeToolError("bad", tool_name="count", details={"field": "text"})
    assert (full.tool_name, full.details) == ("count", {"field": "text"})

    err = NotFoundError("not_found", "no such pack")
    assert isinstance(err, AgentNodeError)
    assert (str(err), err.code, err.message) == ("[not_found] no such pack", "not_found", "no such pack")


def test_agent_runner_reexports_the_sandbox_classes_where_the_wrapper_runs(sdk: ModuleType) -> None:
    from agentnode_sdk.runtimes import agent_runner

    for name in (
        "AgentContext",
        "AgentLimitExceeded",
        "AgentTerminated",
        "LLMResult",
        "ToolContext",
        "RetryConfig",
        "RunToolResult",
    ):
        assert getattr(agent_runner, name) is getattr(sandbox_wrapper, name), name
    assert sdk.RunToolResult is sandbox_wrapper.RunToolResult  # what context.run_tool returns
    assert "agentnode_sdk._wrapper_types" not in sys.modules  # the wrapper's file is loaded only without it


@pytest.mark.parametrize(
    ("call", "instead"),
    [
        ("agentnode_sdk.run_tool('word-tools', 'count', text='a')", "context.run_tool"),
        ("agentnode_sdk.runner.run_tool('word-tools')", "context.run_tool"),
        ("agentnode_sdk.load_tool('word-tools')", "context.run_tool"),
        ("agentnode_sdk.AgentNodeClient(api_key='k')", "context.run_tool"),
        ("agentnode_sdk.Client()", "context.run_tool"),
        ("agentnode_sdk.AgentNodeRuntime()", "call_llm"),
    ],
)
def test_the_sdks_runtime_entry_points_import_but_refuse_to_run(
    sdk: ModuleType, call: str, instead: str
) -> None:
    import agentnode_sdk.runner  # noqa: F401 - referenced by the evaluated call

    with pytest.raises(NotImplementedError, match="agentnode-sandbox") as caught:
        eval(call, {"agentnode_sdk": sdk})
    assert instead in str(caught.value)


def test_run_tool_keeps_the_sdk_signature(sdk: ModuleType) -> None:
    params = inspect.signature(sdk.run_tool).parameters
    assert list(params) == ["slug", "tool_name", "mode", "timeout", "lockfile_path", "kwargs"]
    assert sdk.runner.run_tool is sdk.run_tool


def test_without_the_wrapper_every_name_is_a_standin_and_no_wrapper_is_loaded() -> None:
    out = _python(
        """
        import dataclasses, pickle
        import agentnode_sdk
        from agentnode_sdk import ToolError, RunToolResult
        from agentnode_sdk.runtimes.agent_runner import (
            AgentContext, AgentLimitExceeded, AgentTerminated, LLMResult, ToolContext, RetryConfig,
        )
        try:
            AgentContext()
            constructed = True
        except NotImplementedError:
            constructed = False
        print(json.dumps({
            "wrapper_loaded": "sandbox_wrapper" in sys.modules or "grpc" in sys.modules,
            "file": agentnode_sdk.__file__,
            "result_fields": [(f.name, None if f.default is dataclasses.MISSING else repr(f.default))
                              for f in dataclasses.fields(RunToolResult)],
            "result": repr(RunToolResult(success=True, result=3)),
            "llm_fields": [f.name for f in dataclasses.fields(LLMResult)],
            "llm": repr(LLMResult("hi")),
            "retry": dataclasses.asdict(RetryConfig()),
            "tool_context": [ToolContext().has_tools, ToolContext(tool_specs=[{}]).has_tools],
            "limits": [issubclass(c, RuntimeError) for c in (AgentLimitExceeded, AgentTerminated)],
            "names": [c.__name__ for c in (AgentContext, AgentLimitExceeded, AgentTerminated, LLMResult,
                                           ToolContext, RetryConfig, RunToolResult)],
            "constructed": constructed,
            "alias": ToolError is agentnode_sdk.AgentNodeToolError,
            "types_files": [sys.modules[c.__module__].__file__ for c in (ToolContext, RetryConfig)],
            "pickled": pickle.loads(pickle.dumps(RetryConfig(max_retries=5))) == RetryConfig(max_retries=5),
        }))
        """,
        COMPAT_DIR,
    )
    assert out["wrapper_loaded"] is False
    assert out["file"] == str(Path(COMPAT_DIR) / "agentnode_sdk" / "__init__.py")
    assert out["result_fields"] == [
        ["success", None],
        ["result", "None"],
        ["error", "None"],
        ["mode_used", "'direct'"],
        ["duration_ms", "0.0"],
        ["timed_out", "False"],
        ["run_id", "None"],
    ]
    assert out["result"] == (
        "RunToolResult(success=True, result=3, error=None, mode_used='direct', duration_ms=0.0, "
        "timed_out=False, run_id=None)"
    )
    assert out["llm_fields"] == ["content", "tool_calls", "usage", "model", "finish_reason"]
    assert out["llm"].startswith("LLMResult(content='hi', tool_calls=None")
    assert out["retry"] == {"max_retries": 2, "backoff_base": 1.0, "backoff_max": 10.0, "enabled": True}
    assert out["tool_context"] == [False, True]
    assert out["limits"] == [True, True]
    assert out["names"] == [
        "AgentContext",
        "AgentLimitExceeded",
        "AgentTerminated",
        "LLMResult",
        "ToolContext",
        "RetryConfig",
        "RunToolResult",
    ]
    assert out["constructed"] is False
    assert out["alias"] is True
    # ToolContext and RetryConfig are the wrapper's own classes, from its file: no copy of them here.
    assert out["types_files"] == [str(REPO / "sandbox_wrapper" / "_types.py")] * 2
    assert out["pickled"] is True


def test_the_wrapper_adds_the_compat_dir_after_the_pack_and_its_requirements(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    (root / ".agentnode-site").mkdir(parents=True)
    out = _python(
        f"""
        from sandbox_wrapper._runner import add_import_root
        from sandbox_wrapper._tool_exec import COMPAT_DIR
        add_import_root({str(root)!r})
        add_import_root({str(root)!r})  # the compat dir is added once
        print(json.dumps([sys.path.index({str(root)!r}), sys.path.index({str(root / ".agentnode-site")!r}),
                          sys.path.index(COMPAT_DIR), len(sys.path), sys.path.count(COMPAT_DIR)]))
        """,
        isolated=False,
    )
    pack_at, requirements_at, compat_at, length, copies = out
    assert pack_at < requirements_at < compat_at == length - 1 and copies == 1


@pytest.mark.parametrize("where", ["", ".agentnode-site"])
def test_a_pack_that_bundles_its_own_agentnode_sdk_gets_it_in_the_sandbox(tmp_path: Path, where: str) -> None:
    root = tmp_path / "pack"
    bundled = root / where / "agentnode_sdk"
    bundled.mkdir(parents=True)
    (bundled / "__init__.py").write_text("BUNDLED = True\n")
    out = _python(
        f"""
        import sandbox_wrapper
        from sandbox_wrapper._runner import add_import_root
        add_import_root({str(root)!r})
        import agentnode_sdk
        print(json.dumps(getattr(agentnode_sdk, "BUNDLED", False)))
        """,
        isolated=False,
    )
    assert out is True


# --- through the host's real tool worker ------------------------------------------------------------

SDK_TOOLS = textwrap.dedent(
    """
    import sys

    import agentnode_sdk
    from agentnode_sdk import ToolError
    from agentnode_sdk.exceptions import AgentNodeToolError
    from agentnode_sdk.runtimes import agent_runner
    from agentnode_sdk.runtimes.agent_runner import AgentContext, AgentLimitExceeded

    def fail(text=""):
        raise AgentNodeToolError("secret-" + text, tool_name="fail", details={"text": text})

    def fail_alias():
        raise ToolError("secret-alias")

    def where():
        return {
            "file": agentnode_sdk.__file__,
            "wrapper_loaded": "sandbox_wrapper" in sys.modules,
            "standin": AgentContext.__module__ + "." + AgentContext.__name__,
            "limit_is_runtime_error": issubclass(AgentLimitExceeded, RuntimeError),
            "tool_context_file": getattr(
                sys.modules[getattr(agent_runner, "ToolContext", where).__module__], "__file__", None
            ),
        }
    """
)


def _toolpack(base: Path, slug: str, source: str, *, bundled: bool = False) -> InstalledToolpack:
    root = base / slug
    root.mkdir(parents=True)
    (root / "sdk_tools.py").write_text(source)
    if bundled:
        (root / "agentnode_sdk").mkdir()
        (root / "agentnode_sdk" / "__init__.py").write_text(
            "from agentnode_sdk.exceptions import AgentNodeToolError\n"
            "__file__ = 'bundled'\n"
            "ToolError = AgentNodeToolError\n"
        )
        (root / "agentnode_sdk" / "exceptions.py").write_text(
            "class BundledToolError(Exception):\n"
            "    def __init__(self, message, **kwargs):\n"
            "        super().__init__(message)\n"
            "AgentNodeToolError = BundledToolError\n"
        )
        (root / "agentnode_sdk" / "runtimes").mkdir()
        (root / "agentnode_sdk" / "runtimes" / "__init__.py").write_text("")
        (root / "agentnode_sdk" / "runtimes" / "agent_runner.py").write_text(
            "class AgentContext: pass\nclass AgentLimitExceeded(Exception): pass\n"
        )
    tools = tuple(
        ToolSpec(name=name, entrypoint=f"sdk_tools:{name}", description="", input_schema=None)
        for name in ("fail", "fail_alias", "where")
    )
    manifest = ToolpackManifest(
        slug=slug, version="1.0.0", name=slug, entrypoint="", tools=tools, dependencies=()
    )
    return InstalledToolpack(slug=slug, version="1.0.0", trust="trusted", root=root, manifest=manifest)


@pytest.fixture
def runner() -> Iterator[ToolRunner]:
    tool_runner = ToolRunner()
    yield tool_runner
    tool_runner.close()


def _gate(runner: ToolRunner, pack: InstalledToolpack) -> ToolGate:
    return ToolGate(
        allowed_packages=(pack.slug,),
        max_tool_calls=10,
        lookup={pack.slug: pack}.get,
        runner=runner,
        deadline=time.monotonic() + 30,
        tool_timeout=10.0,
    )


def test_a_tool_raising_agentnode_tool_error_fails_its_call_in_the_host_worker(
    tmp_path: Path, runner: ToolRunner
) -> None:
    gate = _gate(runner, _toolpack(tmp_path, "sdk-tools", SDK_TOOLS))
    for tool in ("fail", "fail_alias"):
        outcome = gate.call("sdk-tools", tool, json.dumps({"text": "sk-live-1"} if tool == "fail" else {}))
        assert (outcome.success, outcome.result, outcome.error) == (
            False,
            None,
            "tool raised AgentNodeToolError",
        )
        assert "secret" not in outcome.error
    where = gate.call("sdk-tools", "where", "{}")
    assert where.success, where.error
    assert where.result == {
        "file": str(Path(COMPAT_DIR) / "agentnode_sdk" / "__init__.py"),
        "wrapper_loaded": False,  # the worker never loads the wrapper (nor gRPC): the stand-ins serve
        "standin": "agentnode_sdk.runtimes.agent_runner.AgentContext",
        "limit_is_runtime_error": True,
        "tool_context_file": str(REPO / "sandbox_wrapper" / "_types.py"),  # by its path, not as the package
    }


def test_a_toolpack_that_bundles_its_own_agentnode_sdk_gets_it_in_the_host_worker(
    tmp_path: Path, runner: ToolRunner
) -> None:
    gate = _gate(runner, _toolpack(tmp_path, "own-sdk", SDK_TOOLS, bundled=True))
    assert gate.call("own-sdk", "fail", "{}").error == "tool raised BundledToolError"
    where = gate.call("own-sdk", "where", "{}")
    assert where.success, where.error
    assert where.result["file"] == "bundled"


def test_the_image_ships_the_compat_package() -> None:
    shipped = {p.relative_to(REPO).as_posix() for p in _wrapper_sources(REPO)}
    assert {
        "sandbox_wrapper/_compat/agentnode_sdk/__init__.py",
        "sandbox_wrapper/_compat/agentnode_sdk/exceptions.py",
        "sandbox_wrapper/_compat/agentnode_sdk/models.py",
        "sandbox_wrapper/_compat/agentnode_sdk/runtimes/agent_runner.py",
    } <= shipped
