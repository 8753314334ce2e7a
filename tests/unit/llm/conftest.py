"""The local fake provider (tests/support/fake_llm.py) every LLM test module may ask for as `srv`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_llm import FakeLlmServer


@pytest.fixture
def srv() -> Iterator[FakeLlmServer]:
    with FakeLlmServer() as server:
        yield server
