"""Qwen3.5 text decoders (``qwen3_5_text``): hybrid stacks of gated attention and Gated DeltaNet.

``config.layer_types[i]`` says what layer ``i`` mixes tokens with; each layer is ONE block
``self.{i}`` (``layer`` = ``i``), whichever it is.

Full attention (``layers.{i}.self_attn``, :attr:`Block.mixer` ``attention``)
---------------------------------------------------------------------------
Llama's projections with two differences. ``q_proj`` yields ``2 * head_dim`` features per query
head: the forward views its output as (..., heads, 2 * head_dim) and splits each head's slice into
its query (first half) and its output gate (second half); the attention output of head ``h`` is
multiplied by ``sigmoid(gate_h)`` before ``o_proj``. A head's gate rows therefore go with it: the
rows of ``q_proj`` are cut with a per-head width of ``2 * head_dim``. ``q_norm``/``k_norm`` are RMSNorms
of width ``head_dim`` shared by all heads: nothing to slice. Query head ``h`` reads KV head
``h // num_key_value_groups``, the one attribute that must follow the cut (the forward infers the
head counts from the projection widths).

Linear attention (``layers.{i}.linear_attn``, :attr:`Block.mixer` ``linear attention``)
-----------------------------------------------------------------------------------------
With ``K`` key heads of size ``dk`` and ``V`` value heads of size ``dv`` (``V`` a multiple of ``K``):

* ``in_proj_qkv`` (hidden -> ``2*K*dk + V*dv``) gives ``q | k | v``: ``K`` query heads, ``K`` key heads,
  ``V`` value heads, in that order; ``conv1d`` is a depthwise causal convolution over exactly these
  channels (one filter per channel, ``groups = in = out = conv_dim``), followed by SiLU;
* ``in_proj_z`` (``V*dv`` rows: the output gate per value head), ``in_proj_b`` and ``in_proj_a`` (one row
  per value head: ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``), and the
  parameters ``A_log`` and ``dt_bias`` (one entry per value head);
* the gated delta rule runs per value head ``h`` on its own state ``S_h`` (dk x dv):
  ``S_h <- exp(g_h) S_h + beta_h k (v_h - exp(g_h) S_h^T k)^T``, ``o_h = S_h^T q``, with ``q`` and ``k``
  (l2-normalised) those of key head ``h // (V / K)``: both the chunked and the recurrent rule
  ``repeat_interleave`` the key heads by ``V // K``, so value heads ``j*V/K .. (j+1)*V/K - 1`` share key
  head ``j`` (checked numerically: perturbing key head 1's channels moves value heads 3..5 of 6
  only, with ``V``/``K`` = 6/2);
* ``norm`` is a gated RMSNorm of width ``dv`` applied to each value head alone (shared weight:
  nothing to slice), then ``out_proj`` reads ``V*dv`` input features, value head after value head.

So a value head is exactly a "query head" of grouped-query attention and a key head a "KV head": a
block's ``heads`` are the value heads, its ``kv_heads`` the key heads, ``head_dim`` is ``dv`` and ``o``
is ``out_proj`` (gating value head ``h`` zeroes its ``dv`` input columns of ``out_proj``). Removing
value head ``h`` removes its own state, its ``v`` channels (projection rows and conv filters), its
``z`` rows, its ``b``/``a`` rows, its ``A_log``/``dt_bias`` entries and its ``out_proj`` columns; nothing
else reads them, so the kept heads compute exactly what they computed before. A key head (its ``q``
and ``k`` channels, in the projection and the convolution) is kept while a kept value head reads it;
``--gqa duplicate`` copies it once per kept value head (then ``V // K`` = 1). The module attributes
``num_v_heads``, ``num_k_heads``, ``key_dim``, ``value_dim`` and ``conv_dim`` and the convolution's channel
counts and groups follow the cut (the forward splits ``q | k | v`` at ``key_dim`` / ``value_dim``).

The cache of a linear layer (conv state: batch x ``conv_dim`` x kernel; recurrent state: batch x
``V`` x ``dk`` x ``dv``) is created from the cut layer's own shapes, so it shrinks with it. A block without
value heads skips the forward (it adds ``out_proj`` of nothing: zero) and writes zero-channel conv and
recurrent states, so the cache layer reports a previous state as a computing layer would.

Every part of both layer kinds is cut exactly; nothing is refused for exactness. Exact means up to
float rounding, and here rounding shows more than in softmax attention: projections of another
output width (``in_proj_a``/``in_proj_b`` with fewer rows) can round their outputs differently in
the last bit, the decays ``exp(cumsum g)`` turn that into relative errors of about 1e-6, and the
gated RMSNorm rescales each head's small output to unit size. On the tests' tiny random float32
model (released ``rms_norm_eps`` 1e-6) slimmed and gated outputs differ by up to about 2e-5, which
is that model's noise floor (scaling every weight by 1 +- 2^-24 moves its output as much).

For the weight scorers (:meth:`Block.rows`) a linear block's ``q`` rows are its value channels (per
value head) and its ``k`` and ``v`` rows the key and query channels of each key head, read ``dv`` rows
from each key head's start: exact head slices when ``dk == dv`` (as in the released models). The
attention-map scorers have no map to read in a linear block.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import (
    Adapter,
    Block,
    BlockCut,
    CacheCost,
    EmptyStyle,
    Rows,
    Stack,
    channels_op,
    cols_op,
    mixin_op,
    param_op,
    part,
    parts_op,
    rows_op,
    set_op,
)

LINEAR = "linear attention"
LAYER_TYPES = ("full_attention", "linear_attention")


class Qwen35Adapter(Adapter):
    family = "qwen3_5"
    model_types = ("qwen3_5_text",)
    no_stock = "headcut does not write Qwen3.5's stock config for a cut yet (attention and DeltaNet heads)"
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads", "head_dim"),)
    count_fields = (
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "linear_num_value_heads",
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    multiples = (("num_attention_heads", "num_key_value_heads"), ("linear_num_value_heads", "linear_num_key_heads"))
    gqa = True

    def blocks(self, base: nn.Module) -> list[Block]:
        try:
            layers = base.get_submodule("layers")
        except AttributeError:
            return []
        out = []
        for i, layer in enumerate(layers):
            p = f"layers.{i}"
            if isinstance(layer._modules.get("linear_attn"), nn.Module):
                out.append(self._linear_block(base, p, i))
            elif isinstance(layer._modules.get("self_attn"), nn.Module):
                out.append(self._attention_block(base, p, i))
        return out

    def _attention_block(self, base: nn.Module, p: str, i: int) -> Block:
        a = f"{p}.self_attn"
        d = base.get_submodule(a).head_dim
        q, k = f"{a}.q_proj", f"{a}.k_proj"
        heads = base.get_submodule(q).weight.shape[0] // (2 * d)  # query | gate per head
        kv_heads = base.get_submodule(k).weight.shape[0] // d
        layout = (Rows(q, stride=2 * d), Rows(k), Rows(f"{a}.v_proj"))
        return Block(
            name=f"self.{i}",
            kind="self",
            layer=i,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=d,
            attn=a,
            q=q,
            k=k,
            v=f"{a}.v_proj",
            o=f"{a}.o_proj",
            layout=layout,
        )

    def _linear_block(self, base: nn.Module, p: str, i: int) -> Block:
        a = f"{p}.linear_attn"
        mod = base.get_submodule(a)
        dk, dv = mod.head_k_dim, mod.head_v_dim
        qkv = f"{a}.in_proj_qkv"
        heads = mod.in_proj_z.weight.shape[0] // dv
        kv_heads = (mod.in_proj_qkv.weight.shape[0] - heads * dv) // (2 * dk)
        # q rows: each value head's v channels; k and v rows: each key head's k and q channels
        layout = (
            Rows(qkv, offset=2 * kv_heads * dk, stride=dv),
            Rows(qkv, offset=kv_heads * dk, stride=dk),
            Rows(qkv, stride=dk),
        )
        return Block(
            name=f"self.{i}",
            kind="self",
            layer=i,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=dv,
            attn=a,
            q=qkv,
            k=qkv,
            v=qkv,
            o=f"{a}.out_proj",
            fused_qkv=True,
            layout=layout,
            mixer=LINEAR,
        )

    @staticmethod
    def _is_linear(block: Block) -> bool:
        return block.attn.endswith(".linear_attn")

    def empty_style(self, block: Block) -> EmptyStyle:
        if self._is_linear(block):
            return EmptyStyle(o="out_proj", cache=True, outputs=1)  # the DeltaNet returns its output alone
        return EmptyStyle(o="o_proj", cache=True)

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_key_value_groups": cut.groups}

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        q, kv, d = list(cut.q), list(cut.kv), block.head_dim
        if not self._is_linear(block):
            ops = [
                rows_op(block.q, q, 2 * d),  # each head's query and its output gate
                rows_op(block.k, kv, d),
                rows_op(block.v, kv, d),
                cols_op(block.o, q, d),
                set_op(block.attn, **self.head_attrs(block, cut)),
            ]
        else:
            ops = self._linear_ops(base, block, q, kv)
        if not q:
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def _linear_ops(self, base: nn.Module, block: Block, q: list[int], kv: list[int]) -> list[dict[str, Any]]:
        a, dv = block.attn, block.head_dim
        dk = base.get_submodule(a).head_k_dim
        if len(q) % len(kv) if kv else q:
            raise ValueError(f"block {block.name}: {len(q)} value heads do not fill {len(kv)} key heads equally")
        # the q | k | v channels of the projection and of the depthwise convolution
        layout = [part(kv, dk, block.kv_heads), part(kv, dk, block.kv_heads), part(q, dv, block.heads)]
        return [
            parts_op(f"{a}.in_proj_qkv", layout),
            channels_op(f"{a}.conv1d", layout),
            rows_op(f"{a}.in_proj_z", q, dv),
            rows_op(f"{a}.in_proj_b", q, 1),
            rows_op(f"{a}.in_proj_a", q, 1),
            param_op(a, "dt_bias", q, 1),
            param_op(a, "A_log", q, 1),
            cols_op(block.o, q, dv),
            set_op(
                a,
                num_v_heads=len(q),
                num_k_heads=len(kv),
                key_dim=len(kv) * dk,
                value_dim=len(q) * dv,
                conv_dim=2 * len(kv) * dk + len(q) * dv,
            ),
        ]

    def layer_cost(self, base: nn.Module, block: Block, kind: str, args: dict[str, Any]) -> CacheCost:
        """A linear-attention layer holds states, not positions: the recurrent state (``dk x dv`` per value
        head) and the convolution's last ``kernel`` inputs of every channel (``dv`` per value head, the query
        and key channels ``2 * dk`` per key head)."""
        if not self._is_linear(block):
            return super().layer_cost(base, block, kind, args)
        mod = base.get_submodule(block.attn)
        dk, dv, kernel = mod.head_k_dim, block.head_dim, mod.conv_kernel_size
        return CacheCost(kind, 0, per_head=dk * dv + dv * kernel, per_kv=2 * dk * kernel)

    def notes(self, base: nn.Module, blocks: list[Block]) -> list[str]:
        if not any(b.mixer == LINEAR for b in blocks):
            return []
        return ["linear-attention (Gated DeltaNet) blocks: heads are value heads, KV heads are key heads"]

    def check_config(self, config: Any) -> None:
        types = getattr(config, "layer_types", None) or []
        unknown = sorted({t for t in types if t not in LAYER_TYPES}, key=str)
        if unknown:
            raise ValueError(f"Qwen3.5 layer type {unknown[0]!r} is not supported (known: {', '.join(LAYER_TYPES)})")

    def min_values(self, numbers: dict[str, int | None], cls_name: str) -> int:
        """Every layer holds at least ``2 * width * H * d`` values (full attention: q and o) or
        ``2 * width * V * dv`` (linear attention: z and out), whichever its type."""
        layers = numbers.get("num_hidden_layers") or 1
        width = numbers.get("hidden_size") or 1
        attention = (numbers.get("num_attention_heads") or 1) * (numbers.get("head_dim") or 1)
        linear = (numbers.get("linear_num_value_heads") or 1) * (numbers.get("linear_value_head_dim") or 1)
        return layers * 2 * width * min(attention, linear)
