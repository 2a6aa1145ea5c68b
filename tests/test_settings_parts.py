"""Settings are grouped by the part they configure (service/settings/), composed into the one
flat Settings: every field lives in exactly one part, the composed class adds none of its own,
and each field is still read from its PPR_ variable, through Settings and through its part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from service.config import MechanismSettings, Settings
from service.settings import (
    BatchSettings,
    CacheSettings,
    EmbeddingSettings,
    GraphSettings,
    HttpSettings,
    LedgerSettings,
    PrivacySettings,
    ServingSettings,
)

PARTS: list[type[BaseSettings]] = [
    HttpSettings,
    LedgerSettings,
    CacheSettings,
    GraphSettings,
    PrivacySettings,
    ServingSettings,
    BatchSettings,
    EmbeddingSettings,
    MechanismSettings,
]


def test_every_field_is_in_exactly_one_part() -> None:
    owners: dict[str, list[str]] = {}
    for part in PARTS:
        for name in part.model_fields:
            owners.setdefault(name, []).append(part.__name__)
    shared = {name: parts for name, parts in owners.items() if len(parts) > 1}
    assert not shared, f"fields in more than one part: {shared}"
    assert set(owners) == set(Settings.model_fields), (
        f"fields of Settings outside the parts: {sorted(set(Settings.model_fields) - set(owners))}"
    )
    assert not Settings.__annotations__, "a new setting goes into its part's module"
    assert issubclass(Settings, MechanismSettings)


# A value other than the default for one field of each part, as the environment spells it.
ENVIRONMENT: dict[str, tuple[str, Any]] = {
    "PPR_HTTP_HEAD_TIMEOUT_SECONDS": ("2.5", 2.5),
    "PPR_PORT": ("8123", 8123),
    "PPR_DATABASE_URL": ("sqlite:///./other.db", "sqlite:///./other.db"),
    "PPR_LEDGER_GROUP_MAX": ("3", 3),
    "PPR_REDIS_URL": ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
    "PPR_REPLAY_RECENT_ITEMS": ("7", 7),
    "PPR_GRAPH_PATH": ("edges.txt", Path("edges.txt")),
    "PPR_SERVICE_QUOTA_EPSILON": ("12.5", 12.5),
    "PPR_ENGINE_MAX_BATCH": ("5", 5),
    "PPR_BATCH_MAX_ITEMS": ("9", 9),
    "PPR_STEPS": ("42", 42),
}


def test_each_part_reads_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, (raw, _) in ENVIRONMENT.items():
        monkeypatch.setenv(variable, raw)
    settings = Settings()
    parts = {part: part() for part in PARTS}
    for variable, (_, value) in ENVIRONMENT.items():
        name = variable[4:].lower()
        assert getattr(settings, name) == value, variable
        (owner,) = [part for part in PARTS if name in part.model_fields]
        assert getattr(parts[owner], name) == value, f"{owner.__name__} {variable}"


def test_validators_travel_with_their_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    for part, variable, raw in (
        (LedgerSettings, "PPR_DATABASE_URL", "mysql://ledger"),
        (CacheSettings, "PPR_REDIS_URL", "http://cache"),
        (MechanismSettings, "PPR_DEFAULT_K", "5000"),
    ):
        with monkeypatch.context() as env:
            env.setenv(variable, raw)
            for cls in (part, Settings):
                with pytest.raises(ValidationError):
                    cls()


def test_the_release_heartbeat_is_read_under_its_name_and_its_former_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PPR_RELEASE_HEARTBEAT_SECONDS (every graph-wide release beats at it) is also read as
    PPR_SYNTHESIS_HEARTBEAT_SECONDS, its name while only synthesis runs beat; the new name wins;
    a bad value is reported under the variable's name."""
    from pydantic import ValidationError

    from service.config import settings_error

    assert Settings().release_heartbeat_seconds == 5.0
    assert Settings(release_heartbeat_seconds=0.5).release_heartbeat_seconds == 0.5
    monkeypatch.setenv("PPR_SYNTHESIS_HEARTBEAT_SECONDS", "2")
    for cls in (LedgerSettings, Settings):
        assert cls().release_heartbeat_seconds == 2.0
    monkeypatch.setenv("PPR_RELEASE_HEARTBEAT_SECONDS", "3")
    assert Settings().release_heartbeat_seconds == 3.0
    monkeypatch.setenv("PPR_RELEASE_HEARTBEAT_SECONDS", "-1")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert settings_error(caught.value).parameter == "PPR_RELEASE_HEARTBEAT_SECONDS"
    monkeypatch.setenv("PPR_RELEASE_HEARTBEAT_SECONDS", "40")  # over half the 60 s reconcile
    with pytest.raises(ValidationError, match="PPR_RELEASE_HEARTBEAT_SECONDS must be at most"):
        Settings()
