"""The race the group-committing stages are tested with: a lone call runs alone and is held
inside its transaction while two more arrive, which must then share the next one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


def first_alone_then_two_together(
    calls: Sequence[Callable[[], None]],
    *,
    inside: threading.Event,
    hold: threading.Event,
    queued: Callable[[], int],
) -> None:
    """Runs ``calls[0]`` on a thread until it is ``inside`` its held transaction, then the
    other two on threads of their own; once ``queued()`` says both wait, sets ``hold`` and joins
    all three. ``hold`` must be clear when this is called."""
    first, *later = (threading.Thread(target=call) for call in calls)
    first.start()
    assert inside.wait(5)
    for thread in later:
        thread.start()
    while queued() < len(later):
        threading.Event().wait(0.01)
    hold.set()
    for thread in [first, *later]:
        thread.join(5)
