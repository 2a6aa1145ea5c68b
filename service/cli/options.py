"""Argument types shared by commands: each rejects a bad value with a message naming the flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


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
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if math.isnan(value) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"expected a finite {kind}, got {text!r}")
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            raise argparse.ArgumentTypeError(
                f"must be in {left}{low:g}, {high:g}{right}, got {text}"
            )
        return value

    return parse


def positive_float(text: str) -> float:
    return _number("a number", 0.0, math.inf, low_open=True, high_open=True, cast=float)(text)


def open_unit_float(text: str) -> float:
    return _number("a number", 0.0, 1.0, low_open=True, high_open=True, cast=float)(text)


def positive_int(text: str) -> int:
    return int(_number("an integer", 1, math.inf, low_open=False, high_open=True, cast=int)(text))
