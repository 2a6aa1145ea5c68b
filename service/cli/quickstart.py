"""The quick start that ``serve`` prints while its ledger has no accounts: the same commands as
the README's "Quick start" block (a test keeps the two equal), pointed at where this server
listens."""

from __future__ import annotations

QUICK_START = """\
.venv/bin/python -m service accounts create --type admin --json             # the admin: account 1
.venv/bin/python -m service accounts create --type user --node 42 --cap 2 --json  # account 2
KEY=ppr_...   # the api_key the last command printed
curl -s -H "Authorization: Bearer $KEY" "{base}/v1/ppr/42?k=5&epsilon=0.1"
curl -s -H "Authorization: Bearer $KEY" {base}/v1/me/budget
"""


def quick_start(host: str, port: int) -> str:
    """The banner: what to run next, in a second terminal, against ``host:port``."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown}:{port}"
    return (
        "The ledger has no accounts yet. Quick start, in a second terminal (node 42 is in the\n"
        "demo graph; with your own graph, use one of its node ids):\n\n"
        + QUICK_START.format(base=base)
    )
