"""Stock checkpoints: a cut written as a plain transformers model, loadable without headcut.

A cut that keeps the same number of query heads and KV heads (and the same head size) in every block is an
ordinary model of its family with smaller head counts, wherever the family's stock config can state those
counts with an explicit head size (:meth:`headcut.adapters.Adapter.stock_spec`): Llama, Mistral, Qwen2,
Qwen3, SmolLM3, Gemma 2/3, Phi-3 (``head_dim``), DeBERTa-v2 (``attention_head_size``). Such a cut is saved
with the stock config (new ``num_attention_heads``/``num_key_value_heads``, ``head_dim``), without
``auto_map``, the headcut record or headcut's code: ``AutoModelFor*.from_pretrained(out)`` loads it with no
``trust_remote_code`` and no headcut installed.

A cut that keeps the same non-zero number of KV heads (and the same head size) in every block, but different
query heads per KV head (``--gqa uniform`` cuts), is made one by zero query heads (:mod:`headcut.model.padding`):
each KV head gets as many query heads as the most in any block, the added ones zero rows of q and zero columns
of o, so the outputs are the cut's and the KV cache keeps its size; :attr:`CheckpointForm.padding` says what
they cost.

How a stock form is found and checked (:func:`stock_form`):

1. every block has the same query-head count, KV-head count and head size, none of them zero; else, where
   only the query heads per KV head differ and the q and o projections are separate Linear modules with the
   weights in memory, the q and o tensors are padded with zero heads to the largest count (new tensors);
2. the config with those counts is built by the family's own config class; where that class refuses them
   (LlamaConfig wants ``hidden_size`` divisible by the head count even with ``head_dim`` set, transformers
   issue #46082), by a fallback family that holds the same weights under the same names and computes the same
   thing (Llama -> Mistral, with Llama's biases off and no sliding window);
3. the stock class is built on the meta device and takes the cut model's own tensors (no copy; the padded q
   and o tensors where step 1 padded), all of them, with every name and shape matching;
4. one forward of a few synthetic tokens must give the cut model's outputs (max difference within 1e-4 of the
   largest value in float32; 1e-2 in half precision); otherwise the cut is written in headcut's form.

Any step that fails gives the reason instead, which the report and the model card state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch import nn

from ..adapters import adapter_for
from ..adapters.base import Block, StockSpec
from ..config import BenchConfig
from .inputs import make_inputs
from .loading import auto_classes, quiet_transformers
from .padding import Padding, pad_tensors, padded_counts, why_not_paddable

#: relative tolerance of the check forward, by dtype family
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}
HALF_TOLERANCE = 1e-2


@dataclass
class CheckpointForm:
    """How a model is written: ``stock`` (plain transformers, ``architecture`` loaded by ``auto``) or
    ``headcut`` (the cut record and ``modeling_headcut.py``: ``trust_remote_code=True`` or ``headcut.load``).
    ``why_not_stock``: the reason a cut model is not written in stock form; ``model``: the stock model to save
    (sharing the cut model's tensors; None when the model is written as it is)."""

    form: str
    architecture: str
    model_type: str
    auto: str
    why_not_stock: str | None = None
    model: nn.Module | None = field(default=None, repr=False)
    #: the zero query heads a stock form added to hold one head count per layer (None: none added)
    padding: Padding | None = None

    @property
    def stock(self) -> bool:
        return self.form == "stock"

    @property
    def loader(self) -> str:
        """The call that loads the saved folder (``OUT`` stands for its path)."""
        if self.stock:
            return f'transformers.{self.auto}.from_pretrained("OUT")'
        return f'transformers.{self.auto}.from_pretrained("OUT", trust_remote_code=True) or headcut.load("OUT")'

    def to_json(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "loader": self.loader,
            "trust_remote_code": not self.stock,
            "why_not_stock": self.why_not_stock,
            "padding": self.padding.to_json() if self.padding is not None else None,
        }


def original_class(model: nn.Module) -> type:
    """The transformers class a (cut) model was built from (headcut's runtime subclasses stripped)."""
    cls = type(model)
    while cls.__name__.startswith("Headcut") and cls.__bases__:
        cls = cls.__bases__[0]
    return cls


def auto_class_name(config: Any, cls_name: str) -> str:
    """The most specific Auto class that maps ``config``'s model type to ``cls_name`` (``AutoModel`` at worst)."""
    matches = sorted(auto for auto, name in auto_classes(config).items() if name == cls_name)
    specific = [a for a in matches if a != "AutoModel"]
    return specific[0] if specific else "AutoModel"


def _uniform(blocks: list[Block]) -> tuple[int, int, int] | str:
    """The one (heads, KV heads, head size) of every block, or why there is none."""
    shapes = {(b.heads, b.kv_heads, b.head_dim) for b in blocks}
    if len(shapes) > 1:
        counts = sorted({(b.heads, b.kv_heads) for b in blocks})
        shown = ", ".join(f"{h}/{kv}" for h, kv in counts[:4]) + (" ..." if len(counts) > 4 else "")
        return (
            f"the cut keeps different head counts in different blocks (query/KV heads: {shown}), and a stock "
            "config holds one count for every layer"
        )
    heads, kv_heads, head_dim = shapes.pop()
    if heads == 0:
        return "every block lost all its heads"
    return heads, kv_heads, head_dim


def _why_no_padding(blocks: list[Block]) -> str:
    """Why zero query heads cannot give a cut one head count per layer (the KV heads or head sizes differ), or
    nothing where that is not the reason (every block lost all its heads)."""
    differ = [
        what
        for what, values in (("KV heads", {b.kv_heads for b in blocks}), ("head sizes", {b.head_dim for b in blocks}))
        if len(values) > 1
    ]
    if not differ or not any(b.heads for b in blocks):
        return ""
    return f"; padding query heads with zero ones cannot help, as the {' and '.join(differ)} differ per layer"


def _uncut_group(config: Any, spec: StockSpec) -> int:
    """Query heads per KV head of the uncut model, as its config states them (0 where it does not)."""
    heads = getattr(config, spec.heads, None)
    kv_heads = getattr(config, spec.kv_heads, None) if spec.kv_heads is not None else heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or kv_heads <= 0:
        return 0
    return heads // kv_heads


def _cause(exc: BaseException) -> str:
    """The last line of an exception's message: transformers' config validators put the cause there, after a
    header line naming the validator (so :func:`headcut.errors.first_line` would not do)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:200]


def _stock_config(config: Any, spec: StockSpec, counts: tuple[int, int, int]) -> tuple[Any, list[str]]:
    """The stock config holding ``counts`` (the family's own config class, else a fallback), and the reasons
    each refused config gave."""
    heads, kv_heads, head_dim = counts
    base = config.to_dict()
    for key in ("headcut", "auto_map", "architectures", "custom_pipelines", "transformers_version"):
        base.pop(key, None)
    base[spec.heads] = heads
    if spec.kv_heads is not None:
        base[spec.kv_heads] = kv_heads
    base[spec.head_dim] = head_dim
    refusals: list[str] = []
    own = str(config.model_type)
    for model_type in (own, *spec.fallbacks):
        data = dict(base, model_type=model_type)
        if model_type != own:
            wrong = [f"{k}={data.get(k)!r}" for k, v in spec.fallback_fields if data.get(k, v) != v]
            if wrong:
                refusals.append(f"{model_type} cannot hold {', '.join(wrong)}")
                continue
            for key, _ in spec.fallback_fields:
                data.pop(key, None)
            data.update(dict(spec.fallback_sets))
        config_class = transformers.CONFIG_MAPPING[model_type]
        try:
            with quiet_transformers():
                return config_class.from_dict(data), refusals
        except Exception as exc:  # the config class's own validation: its message is the reason
            refusals.append(f"{config_class.__name__} refuses it ({_cause(exc)})")
    return None, refusals


def _stock_model(
    model: nn.Module,
    config: Any,
    cls: type,
    meta: bool = False,
    replace: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """``cls(config)`` holding ``model``'s tensors (shared, not copied), those named in ``replace`` replaced
    (the padded q/o tensors); ValueError where a name or shape differs (``meta``: the model's parameters are on
    the meta device, names and shapes are all there is)."""
    with torch.device("meta"):
        stock = cls(config)
    state = model.state_dict()
    state.update(replace or {})
    wanted = stock.state_dict()
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    if missing or unexpected:
        raise ValueError(f"tensors {'missing' if missing else 'unexpected'}: {(missing or unexpected)[0]}")
    for name, tensor in wanted.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(f"{name} is {tuple(state[name].shape)}, the stock class wants {tuple(tensor.shape)}")
    stock.load_state_dict(state, strict=True, assign=True)
    buffers = dict(model.named_buffers())
    for name, buf in list(stock.named_buffers()):
        if buf.device.type == "meta":  # non-persistent buffers (rotary frequencies): the cut model's own
            if name not in buffers:
                raise ValueError(f"no buffer {name} to take")
            owner, _, attr = name.rpartition(".")
            stock.get_submodule(owner).register_buffer(attr, buffers[name], persistent=False)
    for name, param in stock.named_parameters():
        if param.device.type == "meta" and not meta:
            raise ValueError(f"{name} was not filled")
    stock.tie_weights()
    if getattr(model, "generation_config", None) is not None and getattr(stock, "generation_config", None) is not None:
        stock.generation_config = copy.deepcopy(model.generation_config)
    attn = getattr(model.config, "_attn_implementation", None)
    if attn:
        stock.config._attn_implementation = attn
    return stock.train(model.training)


def _outputs(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        out = model(**inputs)
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value.float()
    return out[0].float()


def _check_forward(model: nn.Module, stock: nn.Module) -> str | None:
    """Why ``stock`` does not compute what ``model`` computes on a few synthetic tokens, or None."""
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in make_inputs(model, BenchConfig(batch_size=1, seq_len=8, seed=0)).items()}
    was_training = model.training
    model.eval()
    stock.eval()
    try:
        expected, got = _outputs(model, inputs), _outputs(stock, inputs)
    except Exception as exc:  # a stock class that cannot run the cut's weights is not a stock form
        return f"the stock model fails on a test input ({_cause(exc)})"
    finally:
        model.train(was_training)
        stock.train(was_training)
    dtype = next(model.parameters()).dtype
    tolerance = TOLERANCE.get(dtype, HALF_TOLERANCE) * max(1.0, float(expected.abs().max()))
    diff = float((expected - got).abs().max()) if expected.shape == got.shape else float("inf")
    if not diff <= tolerance:
        return f"the stock model's outputs differ from the cut model's by {diff:.2e} (tolerance {tolerance:.1e})"
    return None


def stock_form(model: nn.Module, verify: bool = True, meta: bool = False) -> CheckpointForm:
    """How ``model`` is written (see the module's doc): in stock form when it is uncut, or when its cut keeps the
    same heads in every block (or the same KV heads, the query heads padded with zero ones) and the family's
    stock config holds that (checked by one forward unless ``verify`` is false); else in headcut's form, with
    the reason. ``meta``: the model's parameters are on the meta device (a layer-wise cut: its weights are
    written layer by layer), so only names and shapes are checked (no forward) and nothing is padded."""
    cls = original_class(model)
    config = model.config
    model_type = str(getattr(config, "model_type", ""))
    auto = auto_class_name(config, cls.__name__)
    if getattr(config, "headcut", None) is None:
        return CheckpointForm("stock", cls.__name__, model_type, auto)

    def headcut_form(why: str) -> CheckpointForm:
        return CheckpointForm("headcut", cls.__name__, model_type, auto, why_not_stock=why)

    adapter = adapter_for(model)
    spec = adapter.stock_spec(model_type)
    family = model_type or adapter.family
    if spec is None:
        return headcut_form(f"{family}: {adapter.no_stock}")
    blocks = adapter.blocks(model.base_model)
    counts = _uniform(blocks)
    padding: Padding | None = None
    replace: dict[str, torch.Tensor] | None = None
    padded: tuple[int, int, int] | None = None
    if isinstance(counts, str):
        padded = padded_counts(blocks)
        if padded is None:
            return headcut_form(counts + _why_no_padding(blocks))
        if spec.kv_heads is None or why_not_paddable(model.base_model, blocks) is not None:
            return headcut_form(counts)
        if meta:
            return headcut_form(
                counts + "; zero query heads would make one count of them (the KV heads are the same in every layer), "
                "but padding needs the weights in memory and a layer-wise cut writes them layer by layer"
            )
        counts = padded
    stock_config, refusals = _stock_config(config, spec, counts)
    if stock_config is None and padded is not None:
        # where the config refuses the count (Gemma 3 270M: 3 heads do not divide its width), more zero heads
        # per KV head, up to the uncut model's, may give one it holds
        kv_heads, head_dim = padded[1], padded[2]
        for groups in range(padded[0] // kv_heads + 1, _uncut_group(config, spec) + 1):
            wider = (groups * kv_heads, kv_heads, head_dim)
            stock_config, _ = _stock_config(config, spec, wider)
            if stock_config is not None:
                counts = wider
                break
    if stock_config is None:
        padded_note = " (padded with zero query heads)" if padded is not None else ""
        return headcut_form(
            f"{counts[0]} query heads of size {counts[2]} in every block{padded_note}: " + "; ".join(refusals)
        )
    if padded is not None:
        replace, padding = pad_tensors(model, blocks, counts[0] // counts[1])
    stock_name = auto_classes(stock_config).get(auto)
    stock_cls = getattr(transformers, stock_name, None) if stock_name else None
    if stock_cls is None:
        return headcut_form(f"{stock_config.model_type} has no class for {auto} ({cls.__name__})")
    try:
        stock = _stock_model(model, stock_config, stock_cls, meta, replace)
    except (ValueError, RuntimeError, TypeError, AttributeError) as exc:
        return headcut_form(f"{stock_cls.__name__} cannot hold the cut ({_cause(exc)})")
    if verify and not meta:
        why = _check_forward(model, stock)
        if why is not None:
            return headcut_form(why)
    return CheckpointForm("stock", stock_cls.__name__, str(stock_config.model_type), auto, model=stock, padding=padding)


__all__ = ["CheckpointForm", "auto_class_name", "original_class", "stock_form"]
