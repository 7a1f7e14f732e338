"""Slow reference implementations of the paper objectives, written as explicit Python loops
directly from each paper's equation (used only by the objective tests).

Every function works on unnormalised ``(N, D)`` torch tensors with scalar torch operations, so
autograd through a reference gives the equation's exact gradient as well.
"""

from __future__ import annotations

import torch
from torch import Tensor

# --------------------------------------------------------------------------------------------
# inputs


def paired_views(
    n: int, d: int, noise: float, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """Anchors ``z1 ~ N(0, I)`` and positives ``z2 = z1 + noise·ε``: correlated like two dropout
    views, so that each row's positive is clearly its most similar column."""
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=dtype)
    return {"z1": z1, "z2": z1 + noise * torch.randn(n, d, generator=g, dtype=dtype)}


def centred_views(
    n: int,
    d: int,
    noise: float,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    off_noise: float = 0.0,
) -> dict[str, Tensor]:
    """Three views of ``n`` sentences around a centre ``c ~ N(0, I)``: ``z1`` and ``z2`` are
    ``c + noise·ε`` (two dropout views), ``off`` is ``c`` itself, or ``c + off_noise·ε``."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(n, d, generator=g, dtype=dtype)
    z1 = centre + noise * torch.randn(n, d, generator=g, dtype=dtype)
    z2 = centre + noise * torch.randn(n, d, generator=g, dtype=dtype)
    off = centre + off_noise * torch.randn(n, d, generator=g, dtype=dtype) if off_noise else centre
    return {"z1": z1, "z2": z2, "off": off}


# --------------------------------------------------------------------------------------------
# equations


def dot(u: Tensor, v: Tensor) -> Tensor:
    total = u[0] * 0
    for a, b in zip(u, v, strict=True):
        total = total + a * b
    return total


def norm(u: Tensor) -> Tensor:
    return torch.sqrt(dot(u, u))


def cos(u: Tensor, v: Tensor) -> Tensor:
    return dot(u, v) / (norm(u) * norm(v))


def unit(u: Tensor) -> Tensor:
    return u / norm(u)


def mean(values: list[Tensor]) -> Tensor:
    total = values[0] * 0
    for v in values:
        total = total + v
    return total / len(values)


def infonce(z1: Tensor, z2: Tensor, tau: float) -> Tensor:
    """SimCSE Eq. 1: -log e^{cos(h_i,h_i')/τ} / Σ_j e^{cos(h_i,h_j')/τ}."""
    n = z1.shape[0]
    losses = []
    for i in range(n):
        num = torch.exp(cos(z1[i], z2[i]) / tau)
        den = sum(torch.exp(cos(z1[i], z2[j]) / tau) for j in range(n))
        losses.append(-torch.log(num / den))
    return mean(losses)


def focal(z1: Tensor, z2: Tensor, tau: float, m: float) -> Tensor:
    """Focal-InfoNCE Eq. 2."""
    n = z1.shape[0]
    losses = []
    for i in range(n):
        sp = cos(z1[i], z2[i])
        num = torch.exp(sp * sp / tau)
        den = num
        for j in range(n):
            if j != i:
                sn = cos(z1[i], z2[j])
                den = den + torch.exp(sn * (sn + m) / tau)
        losses.append(-torch.log(num / den))
    return mean(losses)


def gs_infonce(z1: Tensor, z2: Tensor, g: Tensor, tau: float, lam: float) -> Tensor:
    """GS-InfoNCE Eq. 5 with given Gaussian vectors ``g`` (M, D)."""
    n = z1.shape[0]
    losses = []
    for i in range(n):
        num = torch.exp(cos(z1[i], z2[i]) / tau)
        den = sum(torch.exp(cos(z2[j], z1[i]) / tau) for j in range(n))
        for k in range(g.shape[0]):
            den = den + lam * torch.exp(cos(g[k], z1[i]) / tau)
        losses.append(-torch.log(num / den))
    return mean(losses)


def off_dropout(z1: Tensor, z2: Tensor, off: Tensor, tau: float, m: float) -> Tensor:
    """ImSimCSE Eq. 3 (s = cos/τ)."""
    n = z1.shape[0]
    losses = []
    for i in range(n):
        pos = torch.exp(cos(z1[i], z2[i]) / tau)
        neg = sum(torch.exp(cos(off[i], off[j]) / tau) for j in range(n) if j != i)
        losses.append(-torch.log(pos / (pos + m * neg)))
    return mean(losses)


def off_dropout_authors_code(z1: Tensor, z2: Tensor, off: Tensor, tau: float, r: float) -> Tensor:
    """The released code: -r·s_p + log(e^{r·s_p} + Σ_{j≠i} e^{s(off_i, off_j)})."""
    n = z1.shape[0]
    losses = []
    for i in range(n):
        sp = r * cos(z1[i], z2[i]) / tau
        den = torch.exp(sp)
        for j in range(n):
            if j != i:
                den = den + torch.exp(cos(off[i], off[j]) / tau)
        losses.append(-sp + torch.log(den))
    return mean(losses)


def standardized_column(z: Tensor, c: int, unbiased: bool, eps: float) -> list[Tensor]:
    n = z.shape[0]
    col = [z[i, c] for i in range(n)]
    mu = mean(col)
    ss = sum((x - mu) ** 2 for x in col)
    var = ss / (n - 1 if unbiased else n)
    sd = torch.sqrt(var + eps)
    return [(x - mu) / sd for x in col]


def dcl(z1: Tensor, z2: Tensor, tau: float, formulation: str, eps: float = 1e-5) -> Tensor:
    """ImSimCSE Eq. 5 (``paper``) or the authors' code scale (``authors_code``)."""
    n, d = z1.shape
    unbiased = formulation == "paper"
    a = [standardized_column(z1, c, unbiased, eps) for c in range(d)]
    b = [standardized_column(z2, c, unbiased, eps) for c in range(d)]
    scale = tau * (n if formulation == "authors_code" else 1)
    per_dim = []
    for c in range(d):
        s = [sum(a[c][i] * b[e][i] for i in range(n)) / scale for e in range(d)]
        den = sum(torch.exp(x) for x in s)
        per_dim.append(-torch.log(torch.exp(s[c]) / den))
    total = sum(per_dim)
    return total / d if formulation == "authors_code" else total


def barlow_twins(z1: Tensor, z2: Tensor, lam_bt: float) -> Tensor:
    """ImSimCSE Eq. 4 (without the sign typo): Σ_c (1-C_cc)² + λ Σ_{c≠d} C_cd²."""
    n, d = z1.shape
    loss = z1[0, 0] * 0
    for c in range(d):
        for e in range(d):
            num = sum(z1[i, c] * z2[i, e] for i in range(n))
            den = torch.sqrt(sum(z1[i, c] ** 2 for i in range(n))) * torch.sqrt(
                sum(z2[i, e] ** 2 for i in range(n))
            )
            cc = num / den
            loss = loss + ((1 - cc) ** 2 if c == e else lam_bt * cc**2)
    return loss


def mixcse_direction(
    h: Tensor, hp: Tensor, tau: float, lam: float, partners: list[int], stop_gradient: bool
) -> Tensor:
    """MixCSE's L_mix for anchors ``h`` with positives ``hp`` and one mix per anchor."""
    n = h.shape[0]
    hn = [unit(h[i]) for i in range(n)]
    hpn = [unit(hp[i]) for i in range(n)]
    losses = []
    for i in range(n):
        pos = torch.exp(dot(hn[i], hpn[i]) / tau)
        den = pos
        for j in range(n):
            if j != i:
                den = den + torch.exp(dot(hn[i], hpn[j]) / tau)
        j = partners[i]
        mixed = unit(lam * hpn[i] + (1 - lam) * hpn[j])
        if stop_gradient:
            mixed = mixed.detach()
        den = den + torch.exp(dot(hn[i], mixed) / tau)
        losses.append(-torch.log(pos / den))
    return mean(losses)


def mixcse_all_columns(h: Tensor, hp: Tensor, tau: float, lam: float) -> Tensor:
    """All rolled mixes as columns, the one dominated by the own positive removed."""
    n = h.shape[0]
    hn = [unit(h[i]) for i in range(n)]
    hpn = [unit(hp[i]) for i in range(n)]
    mixes = [unit(lam * hpn[k] + (1 - lam) * hpn[(k + 1) % n]).detach() for k in range(n)]
    losses = []
    for i in range(n):
        pos = torch.exp(dot(hn[i], hpn[i]) / tau)
        den = pos
        for j in range(n):
            if j != i:
                den = den + torch.exp(dot(hn[i], hpn[j]) / tau)
        for k in range(n):
            if (k + 1) % n != i:
                den = den + torch.exp(dot(hn[i], mixes[k]) / tau)
        losses.append(-torch.log(pos / den))
    return mean(losses)


def supervised_simcse(
    z1: Tensor,
    z2: Tensor,
    neg: Tensor,
    tau: float,
    weight: float = 0.0,
    *,
    focal_m: float | None = None,
    gaussian: Tensor | None = None,
    gs_weight: float = 1.0,
    mix_ratio: float | None = None,
) -> Tensor:
    """Supervised SimCSE, Gao et al. 2021 Eq. 5, with ``K`` hard negatives per pair
    (``neg`` ``(N, K, D)``) and the authors' ``hard_negative_weight`` ``w``:

        l_i = -log e^{E(h_i,h_i⁺)/τ} / ( Σ_j e^{E(h_i,h_j⁺)/τ} + Σ_j Σ_k e^{[j=i]·w} e^{E(h_i,h_jk⁻)/τ} )

    ``E`` the plain cosine, or with ``focal_m`` Focal's ``s²`` (positive) / ``s(s+m)`` (every
    negative column, given hard negatives included). ``gaussian``: GS-InfoNCE's columns with
    weight ``λ``; ``mix_ratio``: one MixCSE mix per anchor of its positive and the next one's.
    """
    n, k = neg.shape[0], neg.shape[1]
    pos_e = (lambda s: s * s) if focal_m is not None else (lambda s: s)
    neg_e = (lambda s: s * (s + focal_m)) if focal_m is not None else (lambda s: s)
    losses = []
    for i in range(n):
        num = torch.exp(pos_e(cos(z1[i], z2[i])) / tau)
        den = num
        for j in range(n):
            if j != i:
                den = den + torch.exp(neg_e(cos(z1[i], z2[j])) / tau)
            for c in range(k):
                w = weight if j == i else 0.0
                den = den + torch.exp(torch.tensor(w, dtype=z1.dtype)) * torch.exp(
                    neg_e(cos(z1[i], neg[j, c])) / tau
                )
        if gaussian is not None:
            for g in gaussian:
                den = den + gs_weight * torch.exp(neg_e(cos(z1[i], g)) / tau)
        if mix_ratio is not None:
            mixed = unit(mix_ratio * unit(z2[i]) + (1 - mix_ratio) * unit(z2[(i + 1) % n]))
            den = den + torch.exp(neg_e(dot(unit(z1[i]), mixed.detach())) / tau)
        losses.append(-torch.log(num / den))
    return mean(losses)


def triplet_views(
    n: int, k: int, d: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> dict[str, Tensor]:
    """Anchors, positives near them and ``k`` hard negatives per row, also near the anchor but
    less so (as a contradiction is lexically close to its premise)."""
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=dtype)
    z2 = z1 + 0.6 * torch.randn(n, d, generator=g, dtype=dtype)
    neg = z1.unsqueeze(1) + 1.0 * torch.randn(n, k, d, generator=g, dtype=dtype)
    return {"z1": z1, "z2": z2, "neg": neg}
