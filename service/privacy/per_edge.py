"""Per-instance RDP of one edge for one noisy-diffusion release (admin audit only).

This is the per-edge report of docs/privacy.md ("The per-edge exposure report"): for the served
noisy diffusion and one edge e = {u, v}, the worst-case analysis (privacy-spec.md, "Noise
allocation") bounds three quantities of the deterministic prefix by constants; for a given
graph G and G' = G with e toggled they can be computed exactly:

* ``w``   = ||x_m - x'_m||_1, the distance of the two prefixes after the m noise-free steps
  (bounded by w_m in the worst case);
* ``lam`` = ||F_G(x_m) - F_G'(x'_m)||_1, their distance after step m + 1 before noise
  (bounded by w_(m+1));
* ``h``   = F_G'(x'_m) - F_G(x'_m), the distortion at the known point x'_m (its l1 norm is
  bounded by rho), and for the reverse direction F_G(x_m) - F_G'(x_m) at x_m.

Here F_G(x) = phi_G(f_G(x)). Step 3 of the derivation: for each direction,

  eps_e(alpha) = min( g(beta^(K-m) w) + sum_i g(|h_i|) + (K-m-1) g(rho),
                      min over tau = m+1..K-1 of g(beta^(K-tau) w_tau(e)) + (K-tau) g(rho) )

with w_tau(e) = beta^(tau-m-1) lam + rho (1 - beta^(tau-m-1)) / (1 - beta), and the larger of
the two directions at each order (per-instance DP is two-sided). From step m + 1 on the iterates
carry noise and the distortion is bounded by rho for every edge: nothing data-dependent is used
there. alpha = infinity replaces g(r) by r / b.

This is a per-instance (pDP) figure, not a DP guarantee: it is an exact function of the private
edges. It is never shown to users or service accounts, never logged, and never used to admit,
charge or calibrate (tests/test_edge_report_confinement.py); the ledger keeps charging the
worst-case curve (:func:`service.privacy.curves.diffusion_rdp`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.privacy.accountant import RdpCurve
from service.privacy.curves import diffusion_rdp, distortion, laplace_rdp, min_noise_free_steps
from service.privacy.modes import Mode
from service.privacy.orders import ORDERS


@dataclass(frozen=True)
class PrefixShifts:
    """The exact prefix quantities of one (graph, edge, seed, mode, beta, eta, m).

    ``w`` and ``lam`` are l1 distances; ``h_forward`` holds |F_G'(x'_m) - F_G(x'_m)| and
    ``h_reverse`` |F_G(x_m) - F_G'(x_m)| on the coordinates where they are not zero.
    """

    w: float
    lam: float
    h_forward: np.ndarray
    h_reverse: np.ndarray


@dataclass(frozen=True)
class ReleaseParameters:
    """What the per-instance curve of one release depends on besides the graph."""

    mode: Mode
    beta: float
    steps: int
    eta: float
    noise_scale: float
    noisy_steps: int

    @property
    def noise_free_steps(self) -> int:
        return self.steps - self.noisy_steps

    def check(self) -> None:
        if self.mode is Mode.PERSONALIZED and self.steps == 1:
            return  # one personalized step adds no noise and uses only the seed's edges
        if not 0.0 < self.beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {self.beta}")
        if not (self.eta > 0 and self.noise_scale > 0):
            raise ValueError("eta and the noise scale must be > 0")
        low = min_noise_free_steps(self.mode)
        if not low <= self.noise_free_steps <= self.steps - 1:
            raise ValueError(
                f"noise-free steps must be in [{low}, {self.steps - 1}], "
                f"got {self.noise_free_steps}"
            )


def _one_direction(
    w: float, lam: float, h: np.ndarray, p: ReleaseParameters
) -> tuple[np.ndarray, float]:
    """eps_e on ORDERS and at infinity for one direction (step 3 of the derivation)."""
    b, beta, K, m = p.noise_scale, p.beta, p.steps, p.noise_free_steps
    rho = distortion(beta) * p.eta
    alpha = ORDERS[:, None]
    g_rho = laplace_rdp(ORDERS, rho / b)
    h = np.abs(np.asarray(h, dtype=np.float64))
    h_sum = laplace_rdp(alpha, h[None, :] / b).sum(axis=1) if h.size else np.zeros_like(ORDERS)
    first = laplace_rdp(ORDERS, beta ** (K - m) * w / b) + h_sum + (K - m - 1) * g_rho
    first_pure = (beta ** (K - m) * w + float(h.sum()) + (K - m - 1) * rho) / b
    taus = np.arange(m + 1, K)
    if taus.size == 0:
        return first, first_pure
    j = (taus - m - 1).astype(np.float64)
    w_tau = beta**j * lam + rho * (1.0 - beta**j) / (1.0 - beta)
    carried = beta ** (K - taus).astype(np.float64) * w_tau
    repeats = (K - taus).astype(np.float64)
    later = laplace_rdp(alpha, carried[None, :] / b) + repeats[None, :] * g_rho[:, None]
    rdp = np.minimum(first, later.min(axis=1))
    pure = min(first_pure, float(np.min((carried + repeats * rho) / b)))
    return rdp, pure


def per_instance_curve(shifts: PrefixShifts, params: ReleaseParameters) -> RdpCurve:
    """The per-instance RDP curve of the edge for one release: the larger of both directions
    at every order (G -> G' uses ``h_forward``, G' -> G ``h_reverse``)."""
    params.check()
    if params.mode is Mode.PERSONALIZED and params.steps == 1:
        return RdpCurve.zero()
    fwd, fwd_pure = _one_direction(shifts.w, shifts.lam, shifts.h_forward, params)
    rev, rev_pure = _one_direction(shifts.w, shifts.lam, shifts.h_reverse, params)
    return RdpCurve(np.maximum(fwd, rev), max(fwd_pure, rev_pure))


def worst_case_curve(params: ReleaseParameters) -> RdpCurve:
    """The curve the ledger charges for the same release (same noise-free steps)."""
    params.check()
    if params.mode is Mode.PERSONALIZED and params.steps == 1:
        return RdpCurve.zero()
    rdp, pure = diffusion_rdp(
        params.noise_scale / params.eta, params.steps, params.beta, params.mode,
        params.noise_free_steps,
    )  # fmt: skip
    return RdpCurve(rdp, pure)
