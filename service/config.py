"""Service configuration from environment variables prefixed ``PPR_`` (pydantic-settings).

Every setting has a safe embedded default: SQLite ledger file, in-process cache, the built-in
demo graph. Mechanism settings are per deployment (one graph), never taken from clients.

The settings are grouped by the part of the service they configure, one module each under
:mod:`service.settings` (the HTTP server, the ledger, the caches, the graph, privacy limits,
the mechanism, serving, batch), each with its fields, validators and documentation.
:class:`Settings` composes those parts by inheritance into one flat class, rather than
nesting them (``settings.http.head_timeout_seconds``), because:

* every call site stays as it is: the service, its tests and benchmarks read about 60
  different settings as ``settings.<name>`` in some 150 places, and other changes in
  flight add settings and read them the same way;
* the environment names stay ``PPR_<FIELD>`` with no nested delimiter or alias per field,
  and :func:`settings_error` still names the variable from the field alone;
* ``Settings(**{name: value})`` from command-line flags and compose files,
  ``Settings.model_fields`` (one entry per ``PPR_`` variable) and ``Settings`` being a
  :class:`MechanismSettings` (it is passed where only the mechanism's settings are read) all
  keep working.

A new setting goes into its part's module; the documented table (docs/configuration.md)
lists every field of :class:`Settings` and nothing else (a test checks both directions).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from service.errors import InvalidParameter
from service.settings.batch import BatchSettings
from service.settings.cache import CacheSettings
from service.settings.embeddings import EmbeddingSettings
from service.settings.graph import GraphSettings
from service.settings.http import HttpSettings
from service.settings.ledger import LedgerSettings
from service.settings.mechanism import MechanismSettings as MechanismSettings
from service.settings.privacy import PrivacySettings
from service.settings.serving import ServingSettings


class Settings(
    HttpSettings,
    LedgerSettings,
    CacheSettings,
    GraphSettings,
    PrivacySettings,
    ServingSettings,
    BatchSettings,
    EmbeddingSettings,
    MechanismSettings,
):
    """All settings of the service process: every part's, as one flat object."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore", populate_by_name=True)

    @property
    def prefix_cache_bytes_per_worker(self) -> int:
        """This worker's share of the machine's prefix cache bound."""
        return self.prefix_cache_bytes // self.workers


def settings_error(
    exc: ValidationError, *, flags: Mapping[str, str] | None = None
) -> InvalidParameter:
    """The first problem of a settings ``ValidationError`` as one ``invalid_parameter`` error
    naming the ``PPR_*`` variable, or the command-line flag in ``flags`` that set it."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    env = "_".join(loc).upper() if loc else "PPR_* settings"
    if not env.startswith("PPR_"):  # a field read under an alias is named by that alias
        env = "PPR_" + env
    name = (flags or {}).get(env, env)
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidParameter(name, message)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
