"""The service's settings, one module per part they configure.

Each part is a pydantic-settings class over the ``PPR_`` environment with its fields, their
validators and their documentation: the HTTP server (``http``), the budget ledger
(``ledger``), the caches (``cache``), the graph (``graph``), privacy limits beyond one
account (``privacy``), the query mechanism (``mechanism``), how a worker answers queries
(``serving``), the batch endpoint (``batch``) and the similar-nodes endpoint
(``embeddings``). :class:`service.config.Settings` composes
them into the one flat settings object the service reads.
"""

from service.settings.batch import BatchSettings
from service.settings.cache import CacheSettings
from service.settings.embeddings import EmbeddingSettings
from service.settings.graph import GraphSettings
from service.settings.http import HttpSettings
from service.settings.ledger import LedgerSettings
from service.settings.mechanism import MechanismSettings
from service.settings.privacy import PrivacySettings
from service.settings.serving import ServingSettings

__all__ = [
    "BatchSettings",
    "CacheSettings",
    "EmbeddingSettings",
    "GraphSettings",
    "HttpSettings",
    "LedgerSettings",
    "MechanismSettings",
    "PrivacySettings",
    "ServingSettings",
]
