"""The embedding salt per graph version, recorded in the ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from service.embeddings.hashing import SALT_BYTES, new_salt
from service.ledger.ledger import Ledger


@pytest.fixture
def second(ledger_url: str, ledger: Ledger) -> Iterator[Ledger]:
    """Another process's ledger on the same database (a second worker or replica)."""
    other = Ledger.from_url(ledger_url)
    yield other
    other.dispose()


def test_one_salt_per_version_shared_by_every_worker(ledger: Ledger, second: Ledger) -> None:
    drawn: list[bytes] = []

    def draw() -> bytes:
        drawn.append(new_salt())
        return drawn[-1]

    first = ledger.embedding_salts.embedding_salt("v1", draw)
    assert len(first) == SALT_BYTES and drawn == [first]
    # a second worker, and a restart, read the recorded salt and draw nothing
    assert second.embedding_salts.embedding_salt("v1", draw) == first
    assert ledger.embedding_salts.embedding_salt("v1", draw) == first
    assert len(drawn) == 1
    # a new graph version gets its own salt
    other = second.embedding_salts.embedding_salt("v2", draw)
    assert other != first and len(drawn) == 2


def test_workers_racing_on_a_new_version_agree(ledger: Ledger, second: Ledger) -> None:
    """Many workers embed on a new version at once: each draws, one insert wins, and every
    one of them returns the winner's salt."""
    barrier = threading.Barrier(8)
    got: list[bytes] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        salt = (ledger if i % 2 else second).embedding_salts.embedding_salt("v-race", new_salt)
        with lock:
            got.append(salt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 8 and len(set(got)) == 1
