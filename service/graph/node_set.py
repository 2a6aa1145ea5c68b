"""Where the node count shows when the node set is derived from the edges (no node list).

Without ``--nodes`` / ``PPR_NODES_PATH`` the served node set is the set of nodes the edges
name, so adding or removing the only edge of a node adds or removes the node: the node count n
is then a function of the edges, and it shows, exactly, in the places below. ``serve`` names
them in its one warning; the README and docs/privacy.md ("The node set") list them in these
words; ``tests/test_structural_node_count.py`` toggles such an edge and checks that nothing
else differs. With a node list n is fixed and none of them moves.
"""

from __future__ import annotations

__all__ = ["NODE_COUNT_SHOWS", "node_count_warning"]

#: Each place n shows, in the words the documents use.
NODE_COUNT_SHOWS: dict[str, str] = {
    "node_exists": "whether a node whose only edge is the protected one exists",
    "ranking_length": "the length of a ranking at k >= n",
    "dp_ie_scale": "DP-IE's `sensitivity` and `noise_scale`",
    "charged_epsilon": "DP-IE's epsilon, and every budget holding one",
    "read_figure": "a service account's read figure",
    "all_node_release": "the all-node embedding release's `nodes` and `epsilon`",
    "metrics": "the `/metrics` counters of charged epsilon",
}


def node_count_warning() -> str:
    """The one line ``serve`` logs when it serves a graph without a node list."""
    places = "; ".join(text.replace("`", "") for text in NODE_COUNT_SHOWS.values())
    return (
        "no node list (--nodes / PPR_NODES_PATH): the node set is derived from the edges and "
        "treated as public; adding or removing a node's only edge changes the node count n, "
        f"which shows in: {places} (README, 'Who learns what'; docs/privacy.md, 'The node set')"
    )
