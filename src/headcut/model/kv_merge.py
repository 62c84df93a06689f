"""Merging KV heads: a block's KV groups become fewer KV heads while every query head is kept (GQA to fewer groups,
MHA to GQA), in closed form from the block's weights and the second moments of its input on calibration data.

Notation: ``x`` the block's input (the hidden state the q, k and v projections read, ``D`` wide), ``C = E[x x^T]``
over the real calibration tokens (with a constant 1 appended where the projection has a bias), ``L`` its Cholesky
factor (``C = L L^T``), ``d`` the head size. A *cluster* is a set of ``m`` KV groups that become one KV head.

Keys, aligned in a way that commutes with the rotary embedding. RoPE (transformers' ``rotate_half`` layout) turns
the pair of features ``(j, j + d/2)`` of a head into the complex number ``z_j = k_j + i k_{j+d/2}`` and multiplies
it by ``e^{i w_j t}`` at position ``t``; a score is ``Re sum_j q_j conj(k_j) e^{i w_j (t_q - t_k)}``. Replacing
``k_j`` by ``a k_j`` and ``q_j`` by ``q_j conj(a)^-1`` (``a`` a complex scalar per pair) commutes with every
rotation and leaves every score as it was, so such an alignment is exact. "Align Attention Heads Before Merging Them" aligns heads by an orthogonal transform of this
kind (Procrustes on rotation planes) and then averages them; here, per pair ``j``, the cluster's key functionals
``a_g`` (complex rows, ``g`` in the cluster) are replaced by ``alpha_g b``, one shared functional ``b`` and a
complex scalar per group, minimising the error of the scores the group's queries see::

    min_{b, alpha}  sum_g  w_g^2  E |a_g x - alpha_g b x|^2,     w_g^2 = sum_{h in g} E |q_{h,j} x|^2

whose solution is the leading singular pair of ``Z = diag(w) A L`` (``A``: the rows ``a_g``):
``Z ~ s u v^H``, ``b = v^H L^-1``, ``alpha_g = s u_g / w_g``. Each query head ``h`` of group ``g`` then reads
``q_{h,j} conj(alpha_g)``: its scores against the shared key equal its scores against ``alpha_g b x``, the best
approximation of its own group's key. A cluster of one group is unchanged (``alpha_g b = a_g``).

Values, with least-squares compensation through the output projection (the closed form of "merge values, then
refit the output projection", solved jointly). Head ``h`` of group ``g`` adds ``O_h V_g x`` (``O_h``: its columns
of the output projection, ``V_g``: the group's value rows) to the block's output, mixed over positions by its
attention. With one shared value map ``V'`` (``d`` rows) and a new ``O'_h`` per head, the error of every head
over the calibration inputs is least when the row space of ``V' L`` is the top-``d`` eigenspace ``U`` of

    M = L^T (sum_g V_g^T Q_g V_g) L,          Q_g = sum_{h in g} O_h^T O_h

and then ``V' = U^T L^-1``, ``O'_h = O_h V_g L U`` (Eckart-Young on the stacked maps ``O_h V_g L``). With
``centered``, the fit is on the covariance around the mean input ``mu``, and the error left at the mean,
``sum_h (O_h V_g - O'_h V') mu``, passes through attention unchanged (attention weights sum to one) into the
output projection's bias: FLAP's bias compensation (An et al. 2024, §3.4) for the merge.

The merged block is first written at its original shape (every group of a cluster holding the cluster's shared
key and value rows, every query head its aligned rows, every head its compensated output columns): the model
computes the merged block's function. :func:`merge_cut` is then the structural cut that keeps one KV head per
cluster and every query head, ordered cluster by cluster, which computes the same, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..adapters import Block, BlockCut
from ..errors import HeadcutError
from .projections import weight_out_in

#: the relative ridge added to a second-moment matrix before its Cholesky factor (a direction the calibration
#: inputs never take still gets a finite weight)
RIDGE = 1e-6


@dataclass
class InputMoments:
    """Float64 sums of a block's input over real tokens: count, sum and sum of outer products."""

    width: int
    n: int = 0
    sum: torch.Tensor = field(init=False)
    outer: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.sum = torch.zeros(self.width, dtype=torch.float64)
        self.outer = torch.zeros(self.width, self.width, dtype=torch.float64)

    def add(self, rows: torch.Tensor) -> None:
        x = rows.detach().reshape(-1, self.width).to(torch.float64)
        self.n += x.shape[0]
        self.sum += x.sum(dim=0).cpu()
        self.outer += (x.T @ x).cpu()

    def mean(self) -> torch.Tensor:
        return self.sum / max(self.n, 1)

    def second(self, bias: bool) -> torch.Tensor:
        """``E[z z^T]`` with ``z = x`` or ``[x; 1]`` (``bias``)."""
        if self.n == 0:
            raise HeadcutError("merging KV heads needs calibration tokens: none reached a merged block")
        c = self.outer / self.n
        if not bias:
            return c
        mu = self.mean()
        top = torch.cat([c, mu[:, None]], dim=1)
        return torch.cat([top, torch.cat([mu, torch.ones(1, dtype=torch.float64)])[None]], dim=0)

    def covariance(self) -> torch.Tensor:
        mu = self.mean()
        return self.outer / max(self.n, 1) - torch.outer(mu, mu)


@dataclass
class BlockWeights:
    """One block's projections as float64 (out, in) matrices, head rows in order; biases or None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None


@dataclass
class MergedBlock:
    """A block's weights after merging, at the original shape (see the module's docstring); ``o_bias_delta``: what
    the bias compensation adds to the output projection's bias (None without it); ``clusters``: the KV groups
    merged into each new KV head; ``error``: the relative least-squares error of the keys and the values."""

    weights: BlockWeights
    clusters: list[list[int]]
    o_bias_delta: torch.Tensor | None
    error: dict[str, float]


def _head_rows(rows_total: int, heads: int, d: int, part: str, block: Block) -> None:
    if rows_total != heads * d:
        raise HeadcutError(f"merging KV heads: {block.name}'s {part} projection has {rows_total} rows, not {heads}x{d}")


def read_block(base: nn.Module, block: Block) -> BlockWeights:
    """The projections of ``block`` (separate q, k, v and o projections, heads one after another)."""
    if block.fused_qkv or block.layout is not None:
        raise HeadcutError(f"merging KV heads: {block.name} has fused or interleaved projections")

    def get(path: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        mod = base.get_submodule(path)
        bias = getattr(mod, "bias", None)
        w = weight_out_in(mod).detach().to("cpu", torch.float64, copy=True)  # never a view of the parameter
        return w, None if bias is None else bias.detach().to("cpu", torch.float64, copy=True)

    (q, qb), (k, kb), (v, vb), (o, ob) = get(block.q), get(block.k), get(block.v), get(block.o)
    d = block.head_dim
    _head_rows(q.shape[0], block.heads, d, "query", block)
    _head_rows(k.shape[0], block.kv_heads, d, "key", block)
    _head_rows(v.shape[0], block.kv_heads, d, "value", block)
    _head_rows(o.shape[1], block.heads, d, "output", block)
    return BlockWeights(q, k, v, o, qb, kb, vb, ob)


def write_block(base: nn.Module, block: Block, w: BlockWeights) -> None:
    """Write ``w`` (same shapes) into the block's projections; a bias is written where the module has one."""
    for path, weight, bias in ((block.q, w.q, w.q_bias), (block.k, w.k, w.k_bias), (block.v, w.v, w.v_bias)):
        _set(base.get_submodule(path), weight, bias)
    _set(base.get_submodule(block.o), w.o, w.o_bias)


def _set(mod: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    with torch.no_grad():
        target = weight_out_in(mod)
        target.copy_(weight.to(target.dtype))
        if bias is not None and getattr(mod, "bias", None) is not None:
            mod.bias.copy_(bias.to(mod.bias.dtype))


def cholesky(c: torch.Tensor) -> torch.Tensor:
    scale = float(torch.diagonal(c).mean().clamp_min(1e-30))
    eye = torch.eye(c.shape[0], dtype=c.dtype)
    for ridge in (RIDGE, RIDGE * 100, RIDGE * 1e4):
        factor, info = torch.linalg.cholesky_ex(c + ridge * scale * eye)
        if int(info) == 0:
            return factor
    raise HeadcutError("merging KV heads: the calibration inputs' second moments are not positive definite")


def _augment(w: torch.Tensor, b: torch.Tensor | None, bias: bool) -> torch.Tensor:
    if not bias:
        return w
    return torch.cat([w, (b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype))[:, None]], dim=1)


def _complex_rows(w: torch.Tensor, head: int, d: int) -> torch.Tensor:
    """The ``d/2`` complex functionals of head ``head``'s rows (RoPE's ``rotate_half`` pairs ``(j, j + d/2)``)."""
    rows = w[head * d : (head + 1) * d]
    return torch.complex(rows[: d // 2], rows[d // 2 :])


def _real_rows(z: torch.Tensor) -> torch.Tensor:
    return torch.cat([z.real, z.imag], dim=0)


def _query_energy(q: torch.Tensor, heads: range, d: int, c: torch.Tensor) -> torch.Tensor:
    """``sum_h E |q_{h,j} x|^2`` per pair ``j`` over ``heads`` (RoPE's rotation keeps it)."""
    out = torch.zeros(d // 2, dtype=torch.float64)
    for h in heads:
        rows = q[h * d : (h + 1) * d]
        energy = (rows @ c * rows).sum(dim=1)  # E (r x)^2 per real row
        out += energy[: d // 2] + energy[d // 2 :]
    return out


def merge_keys(
    w: BlockWeights, block: Block, cluster: list[int], c: torch.Tensor, chol: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """The cluster's shared key rows (``d`` x in, augmented where ``bias``), the complex scale ``alpha_g`` per pair
    for each group, and the weighted relative error left (see the module's docstring)."""
    d, group = block.head_dim, block.group_size
    k = _augment(w.k, w.k_bias, bias)
    q = _augment(w.q, w.q_bias, bias)
    rows = torch.stack([_complex_rows(k, g, d) for g in cluster])  # (m, d/2, in)
    weights = torch.stack(
        [_query_energy(q, range(g * group, (g + 1) * group), d, c).clamp_min(1e-30).sqrt() for g in cluster]
    )  # (m, d/2)
    lc = chol.to(torch.complex128)
    shared = torch.zeros(d // 2, rows.shape[-1], dtype=torch.complex128)
    alphas = torch.zeros(len(cluster), d // 2, dtype=torch.complex128)
    lost = total = 0.0
    for j in range(d // 2):
        z = weights[:, j, None] * (rows[:, j, :] @ lc)  # diag(w) A L, (m, in)
        u, s, vh = torch.linalg.svd(z, full_matrices=False)
        shared[j] = torch.linalg.solve_triangular(lc, vh[:1], upper=False, left=False)[0]  # b L = v^H
        alphas[:, j] = s[0] * u[:, 0] / weights[:, j]
        energy = float((s**2).sum())
        total += energy
        lost += energy - float(s[0] ** 2)
    return _real_rows(shared), {g: alphas[i] for i, g in enumerate(cluster)}, lost / total if total else 0.0


def _scaled_queries(q: torch.Tensor, head: int, d: int, alpha: torch.Tensor) -> torch.Tensor:
    """Head ``head``'s rows (with a bias column where augmented) reading ``q_j conj(alpha_j)``."""
    return _real_rows(_complex_rows(q, head, d) * alpha.conj()[:, None])


def merge_values(
    w: BlockWeights, block: Block, cluster: list[int], c: torch.Tensor, chol: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
    """The cluster's shared value rows (``d`` x in, augmented where ``bias``), each of its query heads' new output
    columns (out x ``d``), and the relative error left (see the module's docstring)."""
    d, group = block.head_dim, block.group_size
    v = _augment(w.v, w.v_bias, bias)
    paths = [
        (h, w.o[:, h * d : (h + 1) * d] @ v[g * d : (g + 1) * d] @ chol)
        for g in cluster
        for h in range(g * group, (g + 1) * group)
    ]  # O_h V_g L
    gram = sum((p.T @ p for _, p in paths), torch.zeros(chol.shape[0], chol.shape[0], dtype=torch.float64))
    values, vectors = torch.linalg.eigh(gram)
    top = vectors[:, -d:].flip(-1)  # U, the top-d eigenvectors
    shared = torch.linalg.solve_triangular(chol, top.T, upper=False, left=False)  # V' L = U^T
    total = float(values.clamp_min(0).sum())
    kept = float(values[-d:].clamp_min(0).sum())
    columns = {h: p @ top for h, p in paths}
    return shared, columns, (total - kept) / total if total else 0.0


def merge_block(
    w: BlockWeights,
    block: Block,
    clusters: list[list[int]],
    moments: InputMoments,
    centered: bool,
) -> MergedBlock:
    """Merge each cluster of ``block``'s KV groups into one KV head, at the original shape (see the module's
    docstring); ``centered``: fit the values around the mean input and return the bias compensation."""
    d, group = block.head_dim, block.group_size
    key_bias = w.k_bias is not None
    value_bias = w.v_bias is not None and not centered
    ck = moments.second(key_bias)
    lk = cholesky(ck)
    cv = moments.covariance() if centered else moments.second(value_bias)
    lv = cholesky(cv)
    out = BlockWeights(
        w.q.clone(),
        w.k.clone(),
        w.v.clone(),
        w.o.clone(),
        None if w.q_bias is None else w.q_bias.clone(),
        None if w.k_bias is None else w.k_bias.clone(),
        None if w.v_bias is None else w.v_bias.clone(),
        None if w.o_bias is None else w.o_bias.clone(),
    )
    q_aug = _augment(w.q, w.q_bias, key_bias)
    delta = torch.zeros(w.o.shape[0], dtype=torch.float64) if centered else None
    mu = moments.mean()
    key_err: list[float] = []
    value_err: list[float] = []
    for cluster in clusters:
        if len(cluster) == 1:
            continue
        keys, alphas, err_k = merge_keys(w, block, cluster, ck, lk, key_bias)
        values, columns, err_v = merge_values(w, block, cluster, cv, lv, value_bias)
        key_err.append(err_k)
        value_err.append(err_v)
        for g in cluster:
            rows = slice(g * d, (g + 1) * d)
            out.k[rows] = keys[:, : w.k.shape[1]]
            if out.k_bias is not None:
                out.k_bias[rows] = keys[:, -1] if key_bias else 0.0
            out.v[rows] = values[:, : w.v.shape[1]]
            if out.v_bias is not None:
                out.v_bias[rows] = values[:, -1] if value_bias else 0.0
            for h in range(g * group, (g + 1) * group):
                heads = slice(h * d, (h + 1) * d)
                scaled = _scaled_queries(q_aug, h, d, alphas[g])
                out.q[heads] = scaled[:, : w.q.shape[1]]
                if out.q_bias is not None and key_bias:
                    out.q_bias[heads] = scaled[:, -1]
                out.o[:, heads] = columns[h]
                if delta is not None:
                    before = w.o[:, heads] @ (w.v[rows] @ mu + (0 if w.v_bias is None else w.v_bias[rows]))
                    delta += before - columns[h] @ (out.v[rows] @ mu)
    error = {"keys": max(key_err, default=0.0), "values": max(value_err, default=0.0)}
    return MergedBlock(out, [list(c) for c in clusters], delta, error)


def merge_cut(block: Block, clusters: list[list[int]]) -> BlockCut:
    """The structural cut of a block merged at its original shape: one KV head per cluster (its first group: every
    group of a cluster holds the same rows) serving the cluster's query heads, every query head kept."""
    group = block.group_size
    order = tuple(h for cluster in clusters for g in cluster for h in range(g * group, (g + 1) * group))
    return BlockCut(
        order,
        tuple(cluster[0] for cluster in clusters),
        block.heads // len(clusters),
        merged=tuple(tuple(cluster) for cluster in clusters),
    )
