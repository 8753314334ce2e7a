"""Suite-wide guards: the dev extra is installed (one clear error, not hundreds of failures), and where
Docker is required (CI) a Docker test may not skip and at least one must pass."""

from __future__ import annotations

import os

import pytest

from tests.support import extras

REQUIRE_DOCKER = os.environ.get("AGENTNODE_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true"


def pytest_configure(config: pytest.Config) -> None:
    if (message := extras.problem()) is not None:
        raise pytest.UsageError(message)


_counts = {"passed": 0, "skipped": 0, "selected": 0}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _counts["selected"] = sum(1 for item in items if item.get_closest_marker("docker"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "docker" not in report.keywords:
        return
    if report.skipped:
        _counts["skipped"] += 1
    elif report.when == "call" and report.passed:
        _counts["passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not REQUIRE_DOCKER or not _counts["selected"] or session.config.option.collectonly:
        return  # (a collect-only session, as lint's, runs no test at all)
    problem = ""
    if _counts["skipped"]:
        problem = f"{_counts['skipped']} Docker test(s) skipped"
    elif exitstatus == 0 and _counts["passed"] == 0:
        problem = "no Docker test passed"
    if problem:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nerror: {problem}, but Docker tests are required here (AGENTNODE_REQUIRE_DOCKER=1 or CI)")
