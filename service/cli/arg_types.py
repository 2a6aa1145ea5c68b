"""Argument types shared by commands: each rejects a bad value with a message naming the flag."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from service.bounds import (
    CAP_EPSILON_MAX,
    CAP_EPSILON_MIN,
    DELTA_MAX,
    DELTA_MIN,
    ID_MAX,
    LABEL_MAX,
    LIMIT_MAX,
    OFFSET_MAX,
    PRINTABLE,
)
from service.urls import check_database_url, check_redis_url


def _shown(bound: float) -> str:
    """A bound as written: whole numbers in full (2147483647, not 2.14748e+09)."""
    if math.isfinite(bound) and float(bound).is_integer() and abs(bound) < 1e16:
        return str(int(bound))
    return f"{bound:g}"


def _number(
    kind: str,
    low: float,
    high: float,
    *,
    low_open: bool,
    high_open: bool,
    cast: Callable[[str], float],
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = cast(text)
        except ValueError:
            article = "an" if kind[0] in "aeiou" else "a"
            raise argparse.ArgumentTypeError(f"expected {article} {kind}, got {text!r}") from None
        if math.isnan(value) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"expected a finite {kind}, got {text!r}")
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            raise argparse.ArgumentTypeError(
                f"must be in {left}{_shown(low)}, {_shown(high)}{right}, got {text}"
            )
        return value

    return parse


def positive_float(text: str) -> float:
    return _number("number", 0.0, math.inf, low_open=True, high_open=True, cast=float)(text)


def non_negative_float(text: str) -> float:
    return _number("number", 0.0, math.inf, low_open=False, high_open=True, cast=float)(text)


def account_id(text: str) -> int:
    return int(_number("account id", 1, ID_MAX, low_open=False, high_open=False, cast=int)(text))


def key_id(text: str) -> int:
    return int(_number("key id", 1, ID_MAX, low_open=False, high_open=False, cast=int)(text))


def offset(text: str) -> int:
    return int(_number("integer", 0, OFFSET_MAX, low_open=False, high_open=False, cast=int)(text))


def limit(text: str) -> int:
    return int(_number("integer", 1, LIMIT_MAX, low_open=False, high_open=False, cast=int)(text))


def label(text: str) -> str:
    if len(text) > LABEL_MAX:
        raise argparse.ArgumentTypeError(f"at most {LABEL_MAX} characters, got {len(text)}")
    if re.fullmatch(PRINTABLE, text) is None:
        raise argparse.ArgumentTypeError("must not contain control characters (tab, newline, ...)")
    return text


def seconds(text: str) -> float:
    """A duration in seconds, 0 up to a day."""
    return _number("number", 0.0, 86400.0, low_open=False, high_open=False, cast=float)(text)


def open_unit_float(text: str) -> float:
    return _number("number", 0.0, 1.0, low_open=True, high_open=True, cast=float)(text)


def positive_int(text: str) -> int:
    return int(_number("integer", 1, math.inf, low_open=False, high_open=True, cast=int)(text))


def port(text: str) -> int:
    return int(_number("port number", 1, 65535, low_open=False, high_open=False, cast=int)(text))


def _from_check(check: Callable[[str], str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


#: ``--database-url``: a SQLite or PostgreSQL URL whose driver is installed.
database_url = _from_check(check_database_url)
#: ``--redis-url``: a redis://, rediss:// or unix:// URL.
redis_url = _from_check(check_redis_url)


def cap_epsilon(text: str) -> float:
    """A budget cap epsilon in the range every account must have."""
    return _number("number", CAP_EPSILON_MIN, CAP_EPSILON_MAX, low_open=False, high_open=False,
                   cast=float)(text)  # fmt: skip


def budget_delta(text: str) -> float:
    """A budget delta in the range every account must have."""
    return _number("number", DELTA_MIN, DELTA_MAX, low_open=False, high_open=True,
                   cast=float)(text)  # fmt: skip
