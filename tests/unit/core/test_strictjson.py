"""Strict JSON at every boundary: finite numbers only, size before work, bounded depth, never non-JSON out."""

from __future__ import annotations

import json
import math
import time
from typing import Any, NoReturn

import grpc
import pytest

from host.api.server import _kwargs, report_from
from host.core.strictjson import DEFAULT_MAX_DEPTH, JsonRejected, check_finite, dumps_strict, loads_strict
from host.runtime.runner import RunResult

NON_FINITE_TEXTS = [
    "1e999",
    "-1e999",
    "1E400",
    "2e308",
    "[0.1e310]",
    '{"a": {"b": [1, -1e999]}}',
    "NaN",
    "[Infinity]",
    '{"x": -Infinity}',
    '{"x": 1' + "0" * 300 + "e9}",  # overflow by a long mantissa, not a big exponent
    "-9" + "9" * 250 + "e60",
    "1" + "0" * 400,  # an integer no double can hold: JavaScript and jq read it as Infinity
    "[-" + "9" * 309 + "]",
]


@pytest.mark.parametrize("text", NON_FINITE_TEXTS)
def test_non_finite_numbers_are_rejected(text: str) -> None:
    with pytest.raises(JsonRejected):
        loads_strict(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e308", 1e308),
        ("-1.7976931348623157e308", -1.7976931348623157e308),
        ("1e-400", 0.0),  # underflow is finite
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ('{"i": 1, "f": 1.0, "s": "1e999", "n": null}', {"i": 1, "f": 1.0, "s": "1e999", "n": None}),
    ],
)
def test_finite_json_keeps_its_types(text: str, value: Any) -> None:
    parsed = loads_strict(text)
    assert parsed == value and type(parsed) is type(value)


def test_size_is_counted_in_utf8_bytes_before_any_work() -> None:
    assert loads_strict('"' + "é" * 10 + '"', max_bytes=22) == "é" * 10
    with pytest.raises(JsonRejected, match="exceeds 21 bytes"):
        loads_strict('"' + "é" * 10 + '"', max_bytes=21)
    with pytest.raises(JsonRejected, match="exceeds"):
        loads_strict(b"[" * 10_000_000, max_bytes=1024)  # refused by length alone, nothing scanned
    with pytest.raises(JsonRejected, match="not UTF-8"):
        loads_strict(b'"\xff"')


def test_depth_is_bounded_and_strings_do_not_count() -> None:
    assert loads_strict("[" * DEFAULT_MAX_DEPTH + "]" * DEFAULT_MAX_DEPTH) is not None
    with pytest.raises(JsonRejected, match="deeper than 64"):
        loads_strict("[" * (DEFAULT_MAX_DEPTH + 1) + "]" * (DEFAULT_MAX_DEPTH + 1))
    with pytest.raises(JsonRejected, match="deeper"):
        loads_strict('{"a": ' * 65 + "1" + "}" * 65)
    brackets_in_strings = json.dumps(["[[[[{{{{", '\\"[[[', {"k[": "]]]]"}])
    assert loads_strict(brackets_in_strings, max_depth=2) == json.loads(brackets_in_strings)
    assert loads_strict("[[1], [[2]]]", max_depth=3) == [[1], [[2]]]
    with pytest.raises(JsonRejected):
        loads_strict("[[1], [[2]]]", max_depth=2)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        "[" * 1_000_000,
        '{"a": ' * 200_000,
        "[" + "[]," * 340_000 + "[]]",
        json.dumps({"blob": "[" * 1_000_000}),
        '"' + '\\"' * 500_000,  # an unclosed string of escaped quotes (quadratic for a backtracking scan)
        '{"a": "' + '\\"' * 300_000 + '", "b": [' + '"\\"",' * 50_000 + "1]}",
        "[" + "1.5," * 300_000 + "1]",
    ],
    ids=[
        "deep",
        "unbalanced",
        "deep-objects",
        "wide",
        "brackets-in-a-string",
        "unclosed-escapes",
        "many-escapes",
        "many-floats",
    ],
)
def test_hostile_shapes_are_decided_fast(text: str) -> None:
    started = time.thread_time()
    try:
        loads_strict(text, max_bytes=2 << 20)
    except JsonRejected:
        pass
    assert time.thread_time() - started < 1.0


def test_malformed_text_is_rejected_not_raised_as_something_else() -> None:
    for text in ("", "{oops", "[1,]", "'single'", "[" * 500, "1" * 5000):
        with pytest.raises(JsonRejected):
            loads_strict(text)


def test_check_finite_and_dumps_strict() -> None:
    for value in (math.inf, [-math.inf], {"a": (1, math.nan)}):
        with pytest.raises(JsonRejected):
            check_finite(value)
        with pytest.raises(JsonRejected):
            dumps_strict(value)
    deep: Any = []
    for _ in range(DEFAULT_MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(JsonRejected):
        check_finite(deep)
    check_finite({"a": [1, 2.5, "inf", None]})
    assert dumps_strict({"a": 1e308}, sort_keys=True) == '{"a": 1e+308}'


# --- the admin boundary: kwargs in, results out ------------------------------------------------------------


class _Aborted(Exception):
    pass


class _Context:
    """What `_kwargs` needs of a servicer context: abort raises, as gRPC's does."""

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details)


@pytest.mark.parametrize("raw", [*NON_FINITE_TEXTS[:3], '{"n": 1e999}', '{"n": NaN}', "[1]", "{bad"])
def test_kwargs_must_be_a_strict_json_object(raw: str) -> None:
    with pytest.raises(_Aborted) as info:
        _kwargs(raw, _Context())  # type: ignore[arg-type]
    code, details = info.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("INVALID_REQUEST: ")


def test_kwargs_keep_their_types() -> None:
    assert _kwargs("", _Context()) == {}  # type: ignore[arg-type]
    assert _kwargs('{"n": 1, "f": 1.5, "big": 1e308}', _Context()) == {  # type: ignore[arg-type]
        "n": 1,
        "f": 1.5,
        "big": 1e308,
    }


def test_a_report_never_carries_non_json() -> None:
    report = report_from(RunResult(success=True, result={"x": math.inf}, run_id="r"))
    assert not report.success and report.result_json == ""
    assert report.error_code == "result_not_serializable" and report.run_id == "r"
    fine = report_from(RunResult(success=True, result={"x": 1.5, "n": [1, None]}))
    assert fine.success and json.loads(fine.result_json) == {"x": 1.5, "n": [1, None]}
    failed = report_from(RunResult(success=False, error="boom", error_code="agent_error"))
    assert (failed.success, failed.result_json, failed.error_code) == (False, "", "agent_error")


def test_the_number_of_containers_is_bounded_before_parsing() -> None:
    many = "[" + "[]," * 60_000 + "[]]"
    with pytest.raises(JsonRejected, match="more than 50000 arrays and objects"):
        loads_strict(many)
    assert len(loads_strict(many, max_containers=70_000)) == 60_001
    strings = json.dumps(["[]" * 100_000, "{}" * 100_000])  # brackets inside strings are not containers
    assert loads_strict(strings) == json.loads(strings)


def test_the_bracket_count_shortcut_keeps_both_bounds() -> None:
    """A text with few enough opening brackets skips the depth walk; the bounds still hold exactly."""
    assert loads_strict("[[[]]]", max_depth=3) == [[[]]]
    with pytest.raises(JsonRejected, match="deeper than 3"):
        loads_strict("[[[[]]]]", max_depth=3)
    assert loads_strict("[[]]", max_containers=2) == [[]]
    with pytest.raises(JsonRejected, match="more than 2 arrays"):
        loads_strict("[[], []]", max_containers=2)
    assert loads_strict('["[[[[", {"{{": 1}]', max_depth=2) == ["[[[[", {"{{": 1}]
    with pytest.raises(JsonRejected, match="not valid JSON"):
        loads_strict("\ufeff{}")  # a byte-order mark, as json.loads refuses it
    with pytest.raises(JsonRejected, match="not valid JSON"):
        loads_strict("{} {}")


def test_one_decoder_serves_concurrent_threads() -> None:
    """loads_strict shares one decoder (its hooks run Python, so threads switch mid-parse)."""
    import threading

    texts = [json.dumps({f"k{i}": [i / 7, i, {"d": [i * 1.5, str(i)]}] for i in range(n)}) for n in range(40)]
    wrong: list[str] = []

    def parse() -> None:
        for _ in range(50):
            for text in texts:
                if loads_strict(text) != json.loads(text):
                    wrong.append(text)

    threads = [threading.Thread(target=parse) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_utf8_exceeds_counts_bytes_not_characters() -> None:
    from host.core.strictjson import utf8_exceeds

    assert not utf8_exceeds("é" * 5, 10) and utf8_exceeds("é" * 6, 10)  # 2 bytes a character
    assert not utf8_exceeds("😀" * 2, 8) and utf8_exceeds("😀" * 2 + "a", 8)  # 4 bytes a character
    assert utf8_exceeds("\ud800" * 4, 11) and not utf8_exceeds("\ud800" * 4, 12)  # lone surrogates: 3
    assert not utf8_exceeds("a" * 10, 10) and utf8_exceeds("a" * 11, 10)


def test_utf8_len_counts_every_byte_lone_surrogates_as_three() -> None:
    from host.core.strictjson import utf8_exceeds, utf8_len

    for text, size in (("", 0), ("a", 1), ("é", 2), ("€", 3), ("😀", 4), ("\ud800", 3), ("a€\ud800😀", 11)):
        assert utf8_len(text) == size
        assert not utf8_exceeds(text, size) and (size == 0 or utf8_exceeds(text, size - 1))
