"""A synthesis run as ONE graph-wide release in the ledger, and its edge-list file.

The run reuses the ledger's graph-wide release path (the one the degree release takes,
:meth:`Ledger.graph_release`): admitted against the graph-wide cap and charged to the graph-wide
exposure in one transaction BEFORE anything is drawn; the generator runs inside ``draw()``; the
synthetic edge list is stored in the ledger as the release's payload (with its method,
parameters, privacy unit, epsilon and the file's SHA-256) before the file is written. An
interrupted or failed draw refunds the charge (nothing was released) and leaves no file.

The file is written to a 0600 temporary file in the target directory and renamed into place.

Methods:

- ``privdpr``: node-level (eps, delta)-DP, charged its Gaussian RDP curve;
- ``communities``: edge-level pure eps-DP, charged the sum of its Laplace curves;
- ``chung_lu``: post-processing of the service's degree release (``PPR_POPULAR_EPSILON``):
  charged nothing itself; recorded with epsilon 0 and the name of the release it reuses (making
  that degree release, if it does not exist yet, is charged as the degree release).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.errors import InvalidParameter
from service.graph.model import Graph
from service.ledger import GraphCap, Ledger
from service.privacy.accountant import RdpCurve
from service.privacy.synthetic import EDGE_LEVEL, NODE_LEVEL
from service.synthetic.communities import CommunityParams, community_synthesize
from service.synthetic.privdpr import PrivdprParams, privdpr_synthesize
from service.synthetic.sampling import chung_lu

METHODS = ("privdpr", "communities", "chung_lu")
#: Prefix of the ledger's mechanism name of every synthetic release.
RELEASE_PREFIX = "synthetic:"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SyntheticRelease:
    method: str
    release_name: str
    privacy_unit: str
    epsilon: float
    delta: float
    parameters: dict[str, Any]
    nodes: int
    edges: int
    sha256: str
    note: str

    def header(self) -> dict[str, Any]:
        return asdict(self)


def edge_list_text(graph: Graph, u: np.ndarray, v: np.ndarray) -> bytes:
    """``u v`` lines of external ids (isolated nodes cannot appear in an edge list)."""
    left = graph.external_ids(u)
    right = graph.external_ids(v)
    return "".join(f"{a} {b}\n" for a, b in zip(left, right, strict=True)).encode()


def encode_payload(header: dict[str, Any], text: bytes) -> bytes:
    return gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + text, mtime=0)


def decode_payload(payload: bytes) -> tuple[dict[str, Any], bytes]:
    raw = gzip.decompress(payload)
    head, _, text = raw.partition(b"\n")
    return json.loads(head), text


def check_output_path(out: Path) -> None:
    """Refuse an output path that cannot be written, before anything is charged."""
    directory = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise InvalidParameter("out", f"{out} is a directory")
    if not directory.is_dir():
        raise InvalidParameter("out", f"the directory {directory} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".synthetic-", dir=directory)
    except OSError as exc:
        raise InvalidParameter("out", f"cannot write in {directory}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def write_atomically(out: Path, text: bytes) -> None:
    """0600 temporary file beside ``out``, fsync, rename; no partial file on any failure."""
    directory = out.parent if str(out.parent) else Path(".")
    fd, temp = tempfile.mkstemp(prefix=".synthetic-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Request:
    method: str
    epsilon: float
    privdpr: PrivdprParams = field(default_factory=PrivdprParams)
    communities: CommunityParams = field(default_factory=CommunityParams)


def _validate(request: Request, graph: Graph) -> tuple[RdpCurve, float, float, str, dict[str, Any]]:
    """(curve, epsilon charged, delta, privacy unit, parameters), or InvalidParameter."""
    if request.method not in METHODS:
        raise InvalidParameter("method", f"unknown method {request.method!r}: one of {METHODS}")
    if not (np.isfinite(request.epsilon) and request.epsilon > 0):
        raise InvalidParameter("epsilon", f"epsilon must be positive, got {request.epsilon}")
    if graph.n < 2 or graph.m < 1:
        raise InvalidParameter("graph", "the graph needs at least two nodes and one edge")
    if request.method == "privdpr":
        plan = request.privdpr.plan(graph.n, request.epsilon)
        params = {**asdict(request.privdpr), "depth": plan.depth, "steps": plan.steps,
                  "noise_multiplier": plan.multiplier}  # fmt: skip
        return plan.curve, request.epsilon, request.privdpr.delta, NODE_LEVEL, params
    if request.method == "communities":
        cplan = request.communities.plan(request.epsilon)
        return cplan.curve, cplan.epsilon, 0.0, EDGE_LEVEL, asdict(request.communities)
    return RdpCurve.zero(), 0.0, 0.0, EDGE_LEVEL, {}


def synthesize_release(
    ledger: Ledger,
    graph: Graph,
    request: Request,
    out: Path,
    *,
    cap: GraphCap | None,
    degrees: Callable[[], tuple[np.ndarray, str]] | None = None,
    progress: Progress | None = None,
    rng_factory: Callable[[], np.random.Generator],
) -> SyntheticRelease:
    """Admit, charge, draw, store, then write ``out``. ``degrees`` returns the service's degree
    release and its ledger name (``chung_lu`` only)."""
    curve, epsilon, delta, unit, params = _validate(request, graph)
    check_output_path(out)
    if request.method == "chung_lu" and degrees is None:
        raise InvalidParameter("method", "chung_lu needs the service's degree release")
    name = f"{RELEASE_PREFIX}{request.method}:{uuid.uuid4().hex}"
    kept: dict[str, Any] = {}

    def draw() -> bytes:
        rng = rng_factory()
        note = ""
        if request.method == "privdpr":
            u, v, _ = privdpr_synthesize(
                graph.indptr, graph.indices, request.epsilon, request.privdpr, rng, progress
            )
        elif request.method == "communities":
            u, v, _, summary = community_synthesize(
                graph.indptr, graph.indices, request.epsilon, request.communities, rng
            )
            params.update(summary)
        else:
            assert degrees is not None
            released, source = degrees()
            weights = np.maximum(released, 0.0)
            u, v = chung_lu(weights, round(float(weights.sum()) / 2.0), rng)
            params["post_processing_of"] = source
            note = f"post-processing of the degree release {source}: no charge of its own"
        text = edge_list_text(graph, u, v)
        release = SyntheticRelease(
            method=request.method,
            release_name=name,
            privacy_unit=unit,
            epsilon=epsilon,
            delta=delta,
            parameters=params,
            nodes=graph.n,
            edges=int(u.size),
            sha256=hashlib.sha256(text).hexdigest(),
            note=note,
        )
        kept["release"], kept["text"] = release, text
        return encode_payload(release.header(), text)

    payload = ledger.graph_release(
        graph.version, name, epsilon=epsilon, curve=curve, draw=draw, cap=cap
    )
    if "text" not in kept:  # another process made this exact release: read it back
        header, text = decode_payload(payload)
        kept["release"], kept["text"] = SyntheticRelease(**header), text
    write_atomically(out, kept["text"])
    release: SyntheticRelease = kept["release"]
    return release
