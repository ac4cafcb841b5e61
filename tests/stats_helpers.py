"""Goodness-of-fit for the sampling tests: Pearson's chi-square p-value and the sample size it needs.

Why chi-square with a p-value instead of "empirical TV < margin": the margin's false-positive rate is
whatever the noise makes it (one such margin failed a correct sampler with probability ~0.997). Here a
test rejects a correct sampler with probability alpha, stated, and `samples_for_power` says how many draws
make it reject a sampler biased by a given total variation with a given probability.

Power, worst case over the direction of the bias: with expected law p and true law p + d, Pearson's
statistic is asymptotically noncentral chi-square with df = cells - 1 and noncentrality
lambda = n * sum(d_i^2 / p_i). By Cauchy-Schwarz, (sum |d_i|)^2 <= sum(d_i^2 / p_i) * sum(p_i), so a bias
of total variation t (sum |d_i| = 2t) has lambda >= 4 n t^2, with equality when |d_i| is proportional to
p_i. So n = ceil(lambda* / (4 t^2)), where lambda* is the smallest noncentrality with the wanted power,
catches every bias of TV >= t.

The chi-square tail is the regularized upper incomplete gamma (torch.special.gammaincc, float64: exact to
far below the p-values used here, unlike Wilson-Hilferty); the noncentral tail is its Poisson mixture.
No scipy: the package does not depend on it.
"""

from __future__ import annotations

import math

import torch


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def chi2_isf(alpha: float, df: int) -> float:
    """The critical value c with P(chi-square(df) > c) = alpha (bisection on chi2_sf, which is decreasing)."""
    lo, hi = 0.0, df + 100.0 * math.sqrt(df) + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return (lo + hi) / 2


def noncentral_chi2_sf(x: float, df: int, lam: float) -> float:
    """P(X > x) for X ~ noncentral chi-square(df, lam): sum_j Poisson(j; lam/2) * P(chi-square(df + 2j) > x)."""
    half = lam / 2
    j = torch.arange(0, int(half + 20 * math.sqrt(half) + 60), dtype=torch.float64)
    log_weights = -half + j * math.log(half) - torch.lgamma(j + 1) if half > 0 else torch.where(j == 0, 0.0, -math.inf)
    tails = torch.special.gammaincc(df / 2 + j, torch.full_like(j, x / 2))
    return float((log_weights.exp() * tails).sum())


def samples_for_power(tv: float, cells: int, alpha: float, power: float) -> int:
    """Draws n such that the test at level alpha over `cells` outcomes rejects any law whose total variation
    from the expected one is >= tv with probability >= power (asymptotic, worst direction; module docstring)."""
    df = cells - 1
    critical = chi2_isf(alpha, df)
    lo, hi = 0.0, 1.0
    while noncentral_chi2_sf(critical, df, hi) < power:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if noncentral_chi2_sf(critical, df, mid) < power else (lo, mid)
    return math.ceil(hi / (4 * tv * tv))


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value of observed counts [V] against the expected law probs [V].

    Cells the law gives no mass must stay empty: one draw there is impossible under the law, p = 0. The
    remaining cells must each expect >= 5 draws, where the chi-square approximation of the null holds.
    """
    counts, probs = counts.double(), probs.double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    n = counts.sum()
    expected = n * probs[support] / probs[support].sum()
    assert expected.min() >= 5, f"a cell expects {expected.min():.1f} < 5 draws: use more samples or merge cells"
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    return chi2_sf(float(statistic), int(support.sum()) - 1)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """0.5 * sum |a - b| of two laws [V]."""
    return 0.5 * float((a.double() - b.double()).abs().sum())


def tilted(probs: torch.Tensor, tv: float) -> torch.Tensor:
    """A law at total variation tv from probs [V], in (nearly) the direction the test sees least: mass moves
    from one half of the cells to the other in proportion to p_i, so chi-square = tv^2 (1/m_up + 1/m_down)
    is close to its floor 4 tv^2. A negative control drawn from it checks the sample size, not a guess."""
    probs = probs.double() / probs.sum()
    up = torch.zeros_like(probs, dtype=torch.bool)
    for i in probs.argsort(descending=True).tolist():  # greedy partition into two halves of similar mass
        up[i] = float(probs[up].sum()) <= float(probs[~up].sum())
    m_up, m_down = float(probs[up].sum()), float(probs[~up].sum())
    return torch.where(up, probs * (1 + tv / m_up), probs * (1 - tv / m_down))
