"""RDP curves of the service's mechanisms, evaluated on the fixed order grid.

Everything here is a pure function of the mechanism's parameters. The noisy diffusion's curve
depends on eta and the noise scale b only through their ratio, so it is written in terms of
``c = b / eta`` (the spec's scale invariance) with eta = 1.
"""

from __future__ import annotations

import numpy as np

from service.privacy.accountant import RdpCurve
from service.privacy.modes import Mode
from service.privacy.orders import ORDERS


def laplace_rdp(alpha: np.ndarray | float, ratio: np.ndarray | float) -> np.ndarray:
    """Renyi divergence of order ``alpha`` between Lap(b) and Lap(b) shifted by r, with ratio = r/b.

    g = 1/(alpha-1) * ln( alpha/(2alpha-1) e^{(alpha-1) r/b} + (alpha-1)/(2alpha-1) e^{-alpha r/b} )
    (Mironov 2017, Laplace mechanism with epsilon = r/b), in the algebraically equal form
    g = e + log1p((alpha-1)/(2alpha-1) * expm1(e (1-2alpha))) / (alpha-1),  e = r/b,
    which keeps full relative precision for small shifts and does not overflow at alpha = 1e6.
    Broadcasts over alpha and ratio.
    """
    a = np.asarray(alpha, dtype=np.float64)
    e = np.abs(np.asarray(ratio, dtype=np.float64))
    inner = np.log1p((a - 1.0) / (2.0 * a - 1.0) * np.expm1(e * (1.0 - 2.0 * a)))
    return np.asarray(np.maximum(e + inner / (a - 1.0), 0.0))


def laplace_curve(epsilon: float) -> RdpCurve:
    """Curve of the pure epsilon-DP Laplace mechanism (sensitivity / scale = epsilon)."""
    return RdpCurve(laplace_rdp(ORDERS, epsilon), float(epsilon))


def distortion(beta: float) -> float:
    """Per-step distortion rho of the thresholded diffusion, per unit eta: rho = 2 beta eta.

    The paper's Lemma B.1 gives 4 beta eta; the spec's tighter bound (attained on small graphs)
    is 2 beta eta. ``tests/test_distortion_bound.py`` guards this constant.
    """
    return 2.0 * beta


def _weights(tau: np.ndarray, beta: float, mode: Mode) -> np.ndarray:
    """W-infinity shift w_tau at step tau (per unit eta)."""
    rho = distortion(beta)
    exponent = tau - 1 if mode is Mode.PERSONALIZED else tau
    return rho * (1.0 - beta ** exponent.astype(np.float64)) / (1.0 - beta)


def min_noise_free_steps(mode: Mode) -> int:
    """Smallest valid number m of noise-free leading steps (1 personalized, 0 edge)."""
    return 1 if mode is Mode.PERSONALIZED else 0


def diffusion_rdp(
    c: float, steps: int, beta: float, mode: Mode, noise_free_steps: int | None = None
) -> tuple[np.ndarray, float]:
    """RDP vector on ORDERS and pure epsilon of the noisy diffusion with m noise-free steps.

    ``c`` is b / eta. With m = ``noise_free_steps`` (default: the all-steps mechanism)

      eps(alpha) = min( g(beta^(K-m) w_m) + g(lam) + (K-m-1) g(rho),
                        min_{tau = m+1..K-1} g(beta^(K-tau) w_tau) + (K-tau) g(rho) )

    with the mode's w_tau and lam (privacy-spec.md, "Noise allocation"). The pure value uses
    g -> r/b. In personalized mode with K = 1 no noise is added and nothing protected is used:
    the curve is zero.
    """
    if c <= 0 or not np.isfinite(c):
        raise ValueError(f"noise ratio c = b/eta must be positive and finite, got {c}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    low = min_noise_free_steps(mode)
    m = low if noise_free_steps is None else noise_free_steps
    if mode is Mode.PERSONALIZED and steps == 1:
        return np.zeros_like(ORDERS), 0.0
    if not low <= m <= steps - 1:
        raise ValueError(f"noise-free steps must be in [{low}, {steps - 1}], got {m}")

    rho = distortion(beta)
    K = steps
    lam_exponent = m if mode is Mode.PERSONALIZED else m + 1
    lam = rho * (1.0 - beta**lam_exponent) / (1.0 - beta)
    w_m = float(_weights(np.array([m]), beta, mode)[0])

    # Shifts (per unit b) of each term; columns: the m-term, then tau = m+1..K-1.
    taus = np.arange(m + 1, K)
    absorb = np.concatenate(
        [[beta ** (K - m) * w_m], beta ** (K - taus) * _weights(taus, beta, mode)]
    )
    extra = np.concatenate([[lam], np.zeros_like(taus, dtype=np.float64)])
    repeats = np.concatenate([[K - m - 1], K - taus]).astype(np.float64)

    alpha = ORDERS[:, None]
    terms = (
        laplace_rdp(alpha, absorb[None, :] / c)
        + laplace_rdp(alpha, extra[None, :] / c)
        + repeats[None, :] * laplace_rdp(alpha, rho / c)
    )
    rdp = terms.min(axis=1)
    pure = float(np.min((absorb + extra + repeats * rho) / c))
    return rdp, pure


def diffusion_curve(
    c: float, steps: int, beta: float, mode: Mode, noise_free_steps: int | None = None
) -> RdpCurve:
    rdp, pure = diffusion_rdp(c, steps, beta, mode, noise_free_steps)
    return RdpCurve(rdp, pure)
