"""Apply a recorded head cut to a freshly built model.

This file is copied verbatim next to every model headcut saves (as ``headcut_runtime.py``), so
that ``transformers`` can load the slimmed model with ``trust_remote_code=True`` and without
headcut installed. It must therefore import nothing but the standard library and torch.

A cut is a list of *ops*, plain JSON objects computed by headcut's architecture adapters:

* ``{"op": "rows", "path": P, "heads": [...], "head_dim": d, "sections": s}``: keep the output
  features of the projection at ``P`` that belong to ``heads`` (repeats allowed: that duplicates a
  head). With ``sections`` > 1 the output is ``s`` equal fused parts (GPT-2's q|k|v) and the same
  heads are kept in each part.
* ``{"op": "cols", "path": P, "heads": [...], "head_dim": d}``: keep the input features that
  belong to ``heads`` (the output projection).
* ``{"op": "set", "path": P, "attrs": {...}}``: set plain attributes (head counts).
* ``{"op": "mixin", "path": P, "mixin": NAME, "attrs": {...}}``: put a runtime mixin class in front
  of the module's class (``__class__`` swap, so hooks on the module survive) and set attributes.
* ``{"op": "rows", "path": P, "parts": [{"heads": [...], "head_dim": d, "count": n}, ...]}``: the
  output is a concatenation of unequal parts, part ``i`` holding ``n`` heads of ``d`` features; keep
  ``heads`` of each part (a fused projection whose parts differ in head count or size).
* ``{"op": "channels", "path": P, ...}``: keep the channels of a depthwise ``nn.Conv1d`` (one filter
  per channel), chosen as by ``rows`` (``heads``/``head_dim``/``sections`` or ``parts``); its
  channel counts and groups follow.
* ``{"op": "param", "path": P, "name": N, "heads": [...], "head_dim": d}``: keep the entries of
  the module's own parameter ``N`` (along its first dimension) that belong to ``heads``.

Paths are relative to ``model.base_model``, so one cut serves every task head of a family.
Projections are ``nn.Linear`` (weight: out x in) or GPT-2's ``Conv1D`` (weight: in x out); the
difference is read off the module, not from the op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

RUNTIME_FORMAT = 1


#: attributes a ``set`` op may change (head counts and sizes); a mixin's attributes start with ``_hc_``
SET_ATTRS = frozenset({
    "num_attention_heads", "all_head_size", "num_heads", "n_heads", "split_size", "num_key_value_groups",
    "inner_dim", "num_key_value_heads",
    # linear-attention (gated DeltaNet) head counts and widths
    "num_v_heads", "num_k_heads", "key_dim", "value_dim", "conv_dim",
})


class CutError(ValueError):
    """A cut op that this runtime refuses (a damaged or crafted record)."""


def _module(root: nn.Module, path: str) -> nn.Module:
    """The submodule at ``path``, reached through named child modules only."""
    if not isinstance(path, str):
        raise CutError(f"headcut runtime: op path {path!r} is not a string")
    mod = root
    for part in path.split(".") if path else []:
        child = mod._modules.get(part) if part and not part.startswith("_") else None
        if not isinstance(child, nn.Module):
            raise CutError(f"headcut runtime: {path!r} is not a path of child modules")
        mod = child
    return mod


def _value_ok(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _check_attrs(attrs: Any, mixin: bool) -> dict[str, Any]:
    if not isinstance(attrs, dict):
        raise CutError("headcut runtime: op attrs must be an object")
    for key, value in attrs.items():
        allowed = key.startswith("_hc_") and not key.endswith("_") if mixin else key in SET_ATTRS
        if not isinstance(key, str) or not allowed or not _value_ok(value):
            raise CutError(f"headcut runtime: attribute {key!r} may not be set by a cut")
    return attrs


def _check_heads(mod: nn.Module | None, op: dict[str, Any], features: int) -> tuple[list[int], int, int]:
    """Refuse head lists and sizes that do not fit the projection (before building any index); ``mod``
    None: the caller checked what is sliced."""
    heads, head_dim, sections = op.get("heads"), op.get("head_dim"), op.get("sections", 1)
    ints = isinstance(heads, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in heads)
    sizes = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (head_dim, sections))
    if not (ints and sizes and (mod is None or hasattr(mod, "weight"))):
        raise CutError(f"headcut runtime: bad {op.get('op')} op at {op.get('path')!r}")
    if features % sections or any(not 0 <= h < features // sections // head_dim for h in heads):
        raise CutError(f"headcut runtime: {op.get('op')} op at {op.get('path')!r} names heads outside the "
                       f"projection ({features} features)")
    return heads, head_dim, sections


def head_index(heads: list[int], head_dim: int, sections: int = 1, width: int = 0) -> torch.Tensor:
    """Feature indices of ``heads`` (each ``head_dim`` wide), repeated in each of ``sections`` parts
    that are ``width`` features apart."""
    per = [h * head_dim + i for h in heads for i in range(head_dim)]
    idx = [s * width + j for s in range(sections) for j in per]
    return torch.tensor(idx, dtype=torch.long)


def _is_transposed(mod: nn.Module) -> bool:
    # transformers' Conv1D stores (in, out) and has an ``nf`` (= out features) attribute.
    return hasattr(mod, "nf") and not isinstance(mod, nn.Linear)


def _out_features(mod: nn.Module) -> int:
    return mod.weight.shape[1] if _is_transposed(mod) else mod.weight.shape[0]


def _replace_param(mod: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(mod, name)
    setattr(mod, name, nn.Parameter(value.contiguous(), requires_grad=old.requires_grad))


def slice_rows(mod: nn.Module, heads: list[int], head_dim: int, sections: int = 1) -> None:
    """Keep the output features of ``heads`` in a Linear or Conv1D projection."""
    width = _out_features(mod) // sections
    keep_rows(mod, head_index(heads, head_dim, sections, width))


def keep_rows(mod: nn.Module, idx: torch.Tensor) -> None:
    """Keep the output features ``idx`` (in that order) of a Linear or Conv1D projection."""
    idx = idx.to(mod.weight.device)
    with torch.no_grad():
        if _is_transposed(mod):
            _replace_param(mod, "weight", mod.weight.index_select(1, idx))
            mod.nf = len(idx)
        else:
            _replace_param(mod, "weight", mod.weight.index_select(0, idx))
            mod.out_features = len(idx)
        if getattr(mod, "bias", None) is not None:
            _replace_param(mod, "bias", mod.bias.index_select(0, idx))


def slice_cols(mod: nn.Module, heads: list[int], head_dim: int) -> None:
    """Keep the input features of ``heads`` in a Linear or Conv1D projection."""
    idx = head_index(heads, head_dim).to(mod.weight.device)
    with torch.no_grad():
        if _is_transposed(mod):
            _replace_param(mod, "weight", mod.weight.index_select(0, idx))
            if hasattr(mod, "nx"):
                mod.nx = len(idx)
        else:
            _replace_param(mod, "weight", mod.weight.index_select(1, idx))
            mod.in_features = len(idx)


#: the keys of one part of a ``parts`` layout
PART_KEYS = frozenset({"heads", "head_dim", "count"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_parts(op: dict[str, Any], features: int) -> list[tuple[list[int], int, int]]:
    """Refuse a ``parts`` layout that is malformed, mixed with ``heads``, names heads outside its part
    or does not cover exactly ``features`` features."""
    where = f"{op.get('op')} op at {op.get('path')!r}"
    parts = op.get("parts")
    if any(k in op for k in ("heads", "head_dim", "sections")) or not isinstance(parts, list) or not parts:
        raise CutError(f"headcut runtime: bad {where}")
    out, total = [], 0
    for part in parts:
        if not isinstance(part, dict) or set(part) != PART_KEYS:
            raise CutError(f"headcut runtime: bad {where}")
        heads, head_dim, count = part["heads"], part["head_dim"], part["count"]
        if not (isinstance(heads, list) and all(_is_int(h) for h in heads) and _is_int(head_dim) and head_dim >= 1
                and _is_int(count) and count >= 0):
            raise CutError(f"headcut runtime: bad {where}")
        if any(not 0 <= h < count for h in heads):
            raise CutError(f"headcut runtime: {where} names heads outside a part of {count} heads")
        out.append((heads, head_dim, count))
        total += count * head_dim
    if total != features:
        raise CutError(f"headcut runtime: {where} lays out {total} features; the module has {features}")
    return out


def parts_index(parts: list[tuple[list[int], int, int]]) -> torch.Tensor:
    """Feature indices of the kept heads of consecutive parts ``(heads, head_dim, count)``."""
    idx: list[int] = []
    start = 0
    for heads, head_dim, count in parts:
        idx += [start + h * head_dim + i for h in heads for i in range(head_dim)]
        start += count * head_dim
    return torch.tensor(idx, dtype=torch.long)


def _op_index(op: dict[str, Any], features: int) -> torch.Tensor:
    """The kept feature indices an op names by ``parts`` or by ``heads``/``head_dim``/``sections`` (checked)."""
    if "parts" in op:
        return parts_index(_check_parts(op, features))
    heads, head_dim, sections = _check_heads(None, op, features)
    return head_index(heads, head_dim, sections, features // sections)


def _is_depthwise(mod: nn.Module) -> bool:
    """An ``nn.Conv1d`` with one filter per channel (channels in = out = groups)."""
    return (isinstance(mod, nn.Conv1d) and mod.in_channels == mod.out_channels == mod.groups
            and mod.weight.dim() == 3 and mod.weight.shape[:2] == (mod.out_channels, 1))


def slice_channels(mod: nn.Conv1d, idx: torch.Tensor) -> None:
    """Keep the channels ``idx`` (in that order) of a depthwise Conv1d; its channel counts follow."""
    idx = idx.to(mod.weight.device)
    with torch.no_grad():
        _replace_param(mod, "weight", mod.weight.index_select(0, idx))
        if mod.bias is not None:
            _replace_param(mod, "bias", mod.bias.index_select(0, idx))
    mod.in_channels = mod.out_channels = mod.groups = len(idx)


def _own_param(mod: nn.Module, op: dict[str, Any]) -> nn.Parameter:
    """The parameter a ``param`` op names: registered on the module itself, at least one dimension."""
    name = op.get("name")
    param = mod._parameters.get(name) if isinstance(name, str) and not name.startswith("_") else None
    if not isinstance(param, nn.Parameter) or param.dim() < 1:
        raise CutError(f"headcut runtime: {name!r:.40} is not a parameter of {op.get('path')!r}")
    return param


def slice_param(mod: nn.Module, name: str, idx: torch.Tensor) -> None:
    """Keep the entries ``idx`` (first dimension) of the module's own parameter ``name``."""
    with torch.no_grad():
        _replace_param(mod, name, getattr(mod, name).index_select(0, idx.to(getattr(mod, name).device)))


def _first_hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    return kwargs["hidden_states"]


#: the keywords under which transformers hands a KV cache to a model or an attention module, and returns it:
#: ``cache`` from transformers 5.24 on, ``past_key_values`` before
CACHE_KEYWORDS = ("cache", "past_key_values")


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The KV cache an attention module was given (under either keyword, or GPT-NeoX's ``layer_past``),
    or None."""
    for key in (*CACHE_KEYWORDS, "layer_past"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    return None


def returned_cache(output: Any) -> Any:
    """The KV cache a model's output carries (under either name), or None."""
    for key in CACHE_KEYWORDS:
        if key in output.keys():
            return output[key]
    return None


def write_cache_placeholder(module: nn.Module, cache: Any, length: int, like: torch.Tensor) -> None:
    """Give an attention layer without heads a one-feature cache entry per new position.

    transformers reads the number of cached positions off the keys of a cache layer; an empty
    layer would report 0 and shift positions and masks of every later step. A linear-attention
    cache layer (conv and recurrent states, no positions) gets zero-channel states instead."""
    layer_idx = getattr(module, "layer_idx", None)
    if cache is None or layer_idx is None:
        return
    target = getattr(cache, "self_attention_cache", cache)
    layers = getattr(target, "layers", None)
    layer = layers[layer_idx] if isinstance(layers, list) and 0 <= layer_idx < len(layers) else None
    if layer is not None and not hasattr(layer, "update") and hasattr(layer, "update_recurrent_state"):
        # a linear-attention (recurrent) cache layer keeps no positions: empty conv and recurrent
        # states mark it as filled, as the layer's own forward would
        target.update_conv_state(like.new_zeros(like.shape[0], 0, length), layer_idx)
        target.update_recurrent_state(like.new_zeros(like.shape[0], 0, 1, 1), layer_idx)
        return
    dummy = like.new_zeros(like.shape[0], 1, length, 1)
    target.update(dummy, dummy.clone(), layer_idx)


class HeadcutEmptyAttention:
    """Mixin for an attention module whose every head was removed.

    The module then contributes only its output projection's bias (a sum over zero heads). Attributes
    set by the op: ``_hc_o`` (child name of an output projection inside the module, or None when the
    projection follows outside), ``_hc_dropout`` (child name of a dropout after that projection, or
    None), ``_hc_norm`` (child name of a norm applied to input + output inside the module, or None),
    ``_hc_cache`` (whether this is a self-attention that writes a KV cache),
    ``_hc_outputs`` (how many values the original forward returns: the attention output and weights,
    with any middle ones passed through as None; 1: the output alone, not in a tuple, as linear
    attention returns it)."""

    _hc_o: str | None = None
    _hc_dropout: str | None = None
    _hc_norm: str | None = None
    _hc_cache: bool = False
    _hc_outputs: int = 2

    def forward(self, *args: Any, **kwargs: Any) -> tuple | torch.Tensor:
        hidden = _first_hidden(args, kwargs)
        batch, length = hidden.shape[0], hidden.shape[1]
        out = hidden.new_zeros(batch, length, 0)
        if self._hc_o is not None:
            out = getattr(self, self._hc_o)(out)
        if self._hc_dropout is not None:
            out = getattr(self, self._hc_dropout)(out)
        if self._hc_norm is not None:
            out = getattr(self, self._hc_norm)(hidden + out)
        if self._hc_cache and kwargs.get("key_value_states") is None:
            write_cache_placeholder(self, passed_cache(kwargs), length, hidden)
        if self._hc_outputs == 1:
            return out
        weights = hidden.new_zeros(batch, 0, length, length)
        return (out,) + (None,) * (self._hc_outputs - 2) + (weights,)


class _ConfigView:
    """A model config seen through one module: ``overrides`` first, then the shared config."""

    def __init__(self, config: Any, overrides: dict[str, Any]) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_config"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_config"), name, value)


class HeadcutConfigHeads:
    """Mixin for an attention module that reads its query-head count from the model config shared by
    every layer (Phi-3 splits its fused q|k|v output at ``config.num_attention_heads * head_dim``).
    The module then sees ``config.num_attention_heads`` = ``_hc_heads``, its own count after the cut;
    everything else of the config is the shared one."""

    _hc_heads: int = 0

    @property
    def config(self) -> Any:
        return _ConfigView(self.__dict__["config"], {"num_attention_heads": self._hc_heads})

    @config.setter
    def config(self, value: Any) -> None:
        self.__dict__["config"] = value


RUNTIME_MIXINS: dict[str, type] = {
    "HeadcutEmptyAttention": HeadcutEmptyAttention, "HeadcutConfigHeads": HeadcutConfigHeads,
}


def add_mixin(mod: nn.Module, mixin: type, attrs: dict[str, Any]) -> None:
    """Put ``mixin`` in front of the module's class (once) and set its attributes."""
    cls = type(mod)
    if mixin not in cls.__mro__:
        base = cls
        mod.__class__ = type(f"{mixin.__name__}_{base.__name__}", (mixin, base), {"__module__": base.__module__})
    for key, value in attrs.items():
        setattr(mod, key, value)


def apply_ops(root: nn.Module, ops: list[dict[str, Any]], mixins: dict[str, type] | None = None) -> None:
    """Apply cut ops to ``root`` (the model's ``base_model``)."""
    known = dict(RUNTIME_MIXINS)
    known.update(mixins or {})
    if not isinstance(ops, list):
        raise CutError("headcut runtime: ops must be a list")
    for op in ops:
        kind = op.get("op") if isinstance(op, dict) else None
        if kind not in ("rows", "cols", "set", "mixin", "channels", "param"):
            raise CutError(f"headcut runtime: unknown op {kind!r}")
        mod = _module(root, op.get("path"))
        if kind == "rows" and "parts" in op:
            if not hasattr(mod, "weight"):
                raise CutError(f"headcut runtime: bad rows op at {op.get('path')!r}")
            keep_rows(mod, _op_index(op, _out_features(mod)))
        elif kind == "rows":
            heads, head_dim, sections = _check_heads(mod, op, _out_features(mod))
            slice_rows(mod, heads, head_dim, sections)
        elif kind == "channels":
            if not _is_depthwise(mod):
                raise CutError(f"headcut runtime: {op.get('path')!r} is not a depthwise Conv1d")
            slice_channels(mod, _op_index(op, mod.out_channels))
        elif kind == "param":
            param = _own_param(mod, op)
            slice_param(mod, op["name"], _op_index(dict(op, sections=1), param.shape[0]))
        elif kind == "cols":
            in_features = mod.weight.shape[0] if _is_transposed(mod) else mod.weight.shape[1]
            heads, head_dim, _ = _check_heads(mod, dict(op, sections=1), in_features)
            slice_cols(mod, heads, head_dim)
        elif kind == "set":
            for key, value in _check_attrs(op.get("attrs"), mixin=False).items():
                setattr(mod, key, value)
        else:
            if op.get("mixin") not in known:
                raise CutError(f"headcut runtime: unknown mixin {op.get('mixin')!r}")
            add_mixin(mod, known[op["mixin"]], _check_attrs(op.get("attrs", {}), mixin=True))


def apply_cut(model: nn.Module, config: Any, mixins: dict[str, type] | None = None) -> None:
    """Apply the cut recorded in ``config.headcut`` to a model built from that config."""
    record = getattr(config, "headcut", None)
    if record is None:
        return
    if not isinstance(record, dict) or not isinstance(record.get("runtime_format", RUNTIME_FORMAT), int):
        raise CutError("headcut runtime: the headcut record in config.json is damaged")
    if record.get("runtime_format", RUNTIME_FORMAT) > RUNTIME_FORMAT:
        raise CutError("this model was saved by a newer headcut; upgrade headcut_runtime.py")
    if mixins is None:
        mixins = {k: v for k, v in globals().items() if isinstance(v, type) and k.startswith("Headcut")}
    apply_ops(model.base_model, record.get("ops"), mixins)
