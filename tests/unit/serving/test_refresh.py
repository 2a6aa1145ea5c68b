"""Unit tests of :mod:`service.serving.refresh` (parsing the refresh policy)."""

from __future__ import annotations

import pytest

from service.errors import InvalidParameter
from service.serving.refresh import MAX_AGE_LIMIT_SECONDS, RefreshPolicy, parse_refresh


@pytest.mark.parametrize(
    ("text", "fresh", "always", "max_age"),
    [
        (None, False, False, None),
        (None, True, True, None),
        ("on_new_version", False, False, None),
        ("always", False, True, None),
        ("always", True, True, None),
        ("max_age:30s", False, False, 30),
        ("max_age:15m", False, False, 900),
        ("max_age:12h", False, False, 43_200),
        ("max_age:7d", False, False, 604_800),
        ("max_age:2w", False, False, 1_209_600),
        ("max_age:3650d", False, False, MAX_AGE_LIMIT_SECONDS),
        # Longer than ten years (still a schema-valid request): read as ten years.
        ("max_age:3651d", False, False, MAX_AGE_LIMIT_SECONDS),
        ("max_age:999999999w", False, False, MAX_AGE_LIMIT_SECONDS),
    ],
)
def test_each_policy_reads_as_documented(
    text: str | None, fresh: bool, always: bool, max_age: int | None
) -> None:
    policy = parse_refresh(text, fresh=fresh)
    assert policy.always is always and policy.max_age_seconds == max_age
    if text is not None:
        assert parse_refresh(str(policy)) == policy  # printed as it is read


@pytest.mark.parametrize(
    "text",
    ["", "weekly", "max_age", "max_age:", "max_age:0d", "max_age:-1d", "max_age:1y",
     "max_age:1.5d", "max_age:07d", "MAX_AGE:1d", " always", "max_age:1234567890s"],
)  # fmt: skip
def test_anything_else_is_refused_by_name(text: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        parse_refresh(text)
    assert refused.value.parameter == "refresh"


@pytest.mark.parametrize("text", ["on_new_version", "max_age:7d", "always"])
def test_fresh_wins_over_any_policy(text: str) -> None:
    assert parse_refresh(text, fresh=True) == RefreshPolicy("always")


def test_the_default_is_on_new_version() -> None:
    assert parse_refresh(None) == RefreshPolicy() and str(RefreshPolicy()) == "on_new_version"
