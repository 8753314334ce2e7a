"""The names and quantities (host/k8s/objects/names.py): quantities in the API server's canonical form."""

from __future__ import annotations

import pytest

from host.k8s.objects.names import quantity_bytes, quantity_cpu


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (512 * 2**20, "512Mi"), (3 * 2**30, "3Gi"), (1536, "1536"), (2000, "2k"), (4096, "4Ki"),
     (10**6 + 1, "1000001")],
)  # fmt: skip
def test_quantities_are_in_the_api_servers_canonical_form(n: int, text: str) -> None:
    assert quantity_bytes(n) == text


def test_cpu_quantities() -> None:
    assert [quantity_cpu(m) for m in (1000, 1500, 250, 4000)] == ["1", "1500m", "250m", "4"]
