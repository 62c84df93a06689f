"""A streamed checkpoint: a model on the meta device whose tensors are read one layer at a time, for layer-wise,
memory-bounded pruning (``headcut prune --layerwise``).

The whole-model path loads every weight, so the largest model it can prune is the largest that fits. Here
(as FLAP, Wanda and SparseGPT do) the model is built on the meta device, parameters only (buffers such as
rotary frequencies are computed for real, they are small), and its tensors are read from the safetensors
files when they are needed, as they are stored (bf16 stays bf16), by their names in the model:

1. **Capture.** The embeddings and whatever the model computes before its first layer (position embeddings,
   attention masks) run for every calibration batch with each layer replaced by a stand-in that records the
   arguments it is called with and passes its input on; the first layer's input is kept.
2. **Score.** Layer by layer: the layer's weights are read, the scorer runs on that layer alone (its blocks,
   the layer called on the current activations with its recorded arguments, each batch once), the layer's
   outputs become the next layer's inputs, and its weights are dropped. Activations stay in memory, or are
   spilled to a temporary folder when they would not fit the memory budget beside one layer.
3. **Cut.** The exact-budget search of the one-shot methods picks the heads from the scores (the same code as
   the whole-model path).
4. **Write.** Layer by layer again: the layer's weights are read, cut by the adapter's ops (the same ops as
   :func:`headcut.slim`), and written to the output's shards; every other tensor is copied as stored. The
   config (stock where the cut allows, else headcut's record) and the side files follow as for any save.

The scoring pass is :mod:`headcut.scoring.layerwise`, the cut and write pass :mod:`headcut.model.streamed_cut`.
Memory is one layer's weights (twice while it is cut), the embeddings while capturing, and the activations:
flat in the number of layers. Only scorers that need nothing but one layer's forward work layer-wise
(:data:`headcut.scoring.layerwise.LAYERWISE_SCORERS`); the stack must be one list of layers that run once each, in
order, and whose tensors the checkpoint holds under the model's own names.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from ..adapters import Adapter, Block, adapter_for
from ..devices import peak_rss
from ..errors import HeadcutError, label
from .checks import check_dtypes, check_loading
from .layer_cache import layer_stack
from .tensor_files import Checkpoint, write_safetensors


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers for real (accelerate's
    ``init_empty_weights`` idea): parameters are read from the checkpoint later, while non-persistent buffers
    (rotary frequencies) are computed by the modules themselves."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kind = type(module._parameters[name])
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


# ---- the model, its layers and their tensors -------------------------------------------------------------------


class _Stop(Exception):
    """Raised by the last stand-in: the capture needs nothing after the layers."""


class _StandIn(nn.Module):
    """Records the arguments a layer is called with and passes its input on."""

    def __init__(
        self,
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        first: list[torch.Tensor],
        keep_input: bool,
        last: bool,
    ) -> None:
        super().__init__()
        self.calls, self.first, self.keep_input, self.last = calls, first, keep_input, last

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            hidden, rest = args[0], args[1:]
        else:
            hidden, rest = kwargs.pop("hidden_states"), ()
            kwargs = dict(kwargs)
        self.calls.append((rest, kwargs))
        if self.keep_input:
            self.first.append(hidden.detach())
        if self.last:
            raise _Stop
        return hidden


class Activations:
    """One tensor per calibration batch, in memory or in files of a temporary folder."""

    def __init__(self, spill: Path | None) -> None:
        self.spill = spill
        self.items: list[Any] = []

    def append(self, t: torch.Tensor) -> None:
        if self.spill is None:
            self.items.append(t)
            return
        path = self.spill / f"{id(self)}-{len(self.items)}.safetensors"
        try:
            write_safetensors(path, {"t": t})  # an OSError on failure (torch.save's names no errno)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self.items.append(path)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        item = self.items[i]
        if isinstance(item, Path):
            return load_file(item)["t"]
        return item

    def drop(self) -> None:
        for item in self.items:
            if isinstance(item, Path):
                item.unlink(missing_ok=True)
        self.items = []


def _renamed(model: nn.Module, keys: list[str]) -> dict[str, str]:
    """Model name -> checkpoint key for the checkpoint keys that transformers renames on loading (e.g. GPT-NeoX's
    ``embed_out`` -> ``lm_head``): its plain renamings of the model's class are applied; conversions that merge or
    split tensors are not (such tensors are then missing, and refused by name)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping

        transforms = get_model_conversion_mapping(model)
    except Exception:  # an internal API of transformers: without it, names are taken as they are
        return {}
    rules = []
    for t in transforms or []:
        if type(t).__name__ != "WeightRenaming":
            continue
        sources, targets = list(getattr(t, "source_patterns", [])), list(getattr(t, "target_patterns", []))
        if len(sources) == 1 and len(targets) == 1 and not getattr(t, "scope_prefix", None):
            rules.append((re.compile(sources[0]), targets[0]))
    out: dict[str, str] = {}
    for key in keys:
        name = key
        for pattern, target in rules:
            name = pattern.sub(target, name)
        if name != key:
            out[name] = key
    return out


def _ignored_unexpected(model: nn.Module) -> Any:
    """The pattern of checkpoint tensors transformers loads a model without (its ``_keys_to_ignore_on_load_unexpected``,
    and the rotary frequencies and position ids that older checkpoints stored), or None."""
    patterns = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    buffers = [name for name, _ in model.named_buffers()]
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        patterns.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        patterns.add(r"(^|\.)position_ids$")
    return re.compile("|".join(f"({p})" for p in sorted(patterns))) if patterns else None


@dataclass
class StreamedModel:
    """A model built on the meta device over a checkpoint whose tensors are read layer by layer."""

    folder: Path
    model: nn.Module
    adapter: Adapter
    checkpoint: Checkpoint
    blocks: list[Block]
    layers: nn.ModuleList
    #: each layer's name in ``model`` (its tensors' prefix)
    prefixes: list[str]
    #: block name -> its layer's index
    layer_of: dict[str, int]

    @classmethod
    def open(cls, folder: Path, config: Any, model_cls: type, new_head: bool = False) -> StreamedModel:
        """Build ``model_cls(config)`` with meta parameters over ``folder``'s safetensors; refuses a model whose
        blocks are not in one list of layers (see the module's doc), and a checkpoint the whole-model loader
        refuses. ``new_head``: ``model_cls`` is a task other than the checkpoint's own (its head is then refused by
        name: a layer-wise run writes only what the checkpoint holds)."""
        checkpoint = Checkpoint(folder)
        with params_on_meta(), torch.random.fork_rng(devices=[]):
            model = model_cls(copy.deepcopy(config))  # the cut's record goes into this model's config only
        model.eval()
        adapter = adapter_for(model)
        blocks = adapter.blocks(model.base_model)
        if not blocks:
            raise HeadcutError(f"{folder}: the model has no attention blocks to prune")
        stacks: dict[int, nn.ModuleList] = {}
        layer_of: dict[str, int] = {}
        for block in blocks:
            found = layer_stack(model, block)
            if found is None:
                raise HeadcutError(
                    f"layer-wise pruning needs the attention blocks in one list of layers; {block.name} is in none"
                )
            stacks[id(found[0])] = found[0]
            layer_of[block.name] = found[1]
        if len(stacks) != 1:
            raise HeadcutError(
                f"layer-wise pruning needs the attention blocks in one list of layers; "
                f"{adapter.family} has {len(stacks)} (an encoder and a decoder): prune it without "
                "--layerwise"
            )
        shared = [b.name for b in blocks if b.shared]
        if shared:
            raise HeadcutError(
                f"layer-wise pruning cannot cut layers that share weights ({shared[0]}): prune "
                f"{adapter.family} without --layerwise"
            )
        if adapter.no_layerwise:
            raise HeadcutError(f"layer-wise pruning does not apply to {adapter.family}: {adapter.no_layerwise}")
        layers = next(iter(stacks.values()))
        names = {id(m): n for n, m in model.named_modules()}
        prefixes = [names[id(layer)] for layer in layers]
        streamed = cls(folder, model, adapter, checkpoint, blocks, layers, prefixes, layer_of)
        streamed._check_names()
        streamed._check_tensors(new_head)
        checkpoint.cast = checkpoint.working_dtype(config)
        return streamed

    # -- tensors -------------------------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self.renamed = _renamed(self.model, list(self.checkpoint.where))

    def _key(self, name: str) -> str:
        if name in self.checkpoint.where:
            return name
        if name in self.renamed:
            return self.renamed[name]
        prefix = f"{self.model.base_model_prefix}."
        for other in (name.removeprefix(prefix), prefix + name):  # a base model's names and a task model's
            if other != name and other in self.checkpoint.where:
                return other
        raise HeadcutError(
            f"layer-wise pruning reads tensors by their names in the model; {self.folder} has no {name} (a checkpoint "
            "whose tensor names transformers converts on loading cannot be streamed: prune it without --layerwise)"
        )

    def _check_names(self) -> None:
        for prefix, layer in zip(self.prefixes, self.layers):
            for name, _ in layer.named_parameters():
                self._key(f"{prefix}.{name}")

    def _check_tensors(self, new_head: bool = False) -> None:
        """Refuse what the whole-model loader refuses (:func:`headcut.model.checks.check_loading`), from the
        checkpoint's headers: a tensor the model needs that the checkpoint lacks (an output head tied to the
        embeddings excepted), one of another shape, or one the model does not use."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        expected = self.model.state_dict()
        missing, mismatched, used = [], [], set()
        for name, t in expected.items():
            try:
                key = self._key(name)
            except HeadcutError:
                if not (name in tied and tied[name] in expected):
                    missing.append(name)
                continue
            used.add(key)
            if tuple(self.checkpoint.shapes[key]) != tuple(t.shape):
                mismatched.append((name, self.checkpoint.shapes[key], tuple(t.shape)))
        prefix = f"{self.model.base_model_prefix}."
        head = (
            [name for name in missing if not name.startswith(prefix)] if self.model.base_model is not self.model else []
        )
        if new_head and head:
            raise HeadcutError(
                f"{self.folder} has no {type(self.model).__name__} head ({', '.join(head[:4])}): a "
                f"{label('layerwise')} run writes only the tensors the checkpoint holds, so it cannot add "
                "a new task head; prune it without --layerwise"
            )
        ignored = _ignored_unexpected(self.model)
        unexpected = [k for k in self.checkpoint.where if k not in used and not (ignored and ignored.search(k))]
        check_loading(
            self.model,
            {"missing_keys": missing, "unexpected_keys": unexpected, "mismatched_keys": mismatched},
            self.folder,
            None,
        )
        check_dtypes(self.model, self.checkpoint.dtypes, self.folder, self._key_or_none)

    def _key_or_none(self, name: str) -> str | None:
        try:
            return self._key(name)
        except HeadcutError:
            return None

    def _owned(self, module: nn.Module, prefix: str) -> list[tuple[nn.Module, str, str]]:
        """(owner, attribute, checkpoint key) of every parameter and persistent buffer of ``module``."""
        out = []
        for mod_name, mod in module.named_modules():
            full = f"{prefix}.{mod_name}" if mod_name else prefix
            for attr, p in mod._parameters.items():
                if p is not None:
                    out.append((mod, attr, f"{full}.{attr}" if full else attr))
            for attr, b in mod._buffers.items():
                if b is not None and attr not in mod._non_persistent_buffers_set:
                    out.append((mod, attr, f"{full}.{attr}" if full else attr))
        return out

    def materialize(self, module: nn.Module, prefix: str, optional: bool = False) -> int:
        """Read ``module``'s parameters and persistent buffers from the checkpoint (``optional``: skip those it
        lacks, e.g. a tied output head); returns the bytes read."""
        owned = []
        for mod, attr, key in self._owned(module, prefix):
            try:
                owned.append((mod, attr, self._key(key)))
            except HeadcutError:
                if not optional:
                    raise
        tensors = self.checkpoint.read([k for _, _, k in owned])
        total = 0
        for mod, attr, key in owned:
            t = tensors[key]
            current = mod._parameters.get(attr) if attr in mod._parameters else mod._buffers.get(attr)
            if current is not None and tuple(current.shape) != tuple(t.shape):
                raise HeadcutError(
                    f"{self.folder}: {key} is {tuple(t.shape)} but the config makes it {tuple(current.shape)}"
                )
            if attr in mod._parameters:
                mod._parameters[attr] = nn.Parameter(t, requires_grad=False)
            else:
                mod._buffers[attr] = t
            total += t.numel() * t.element_size()
        return total

    @staticmethod
    def release(module: nn.Module) -> None:
        """Put ``module``'s parameters back on the meta device (shapes and dtypes kept)."""
        for mod in module.modules():
            for attr, p in list(mod._parameters.items()):
                if p is not None and p.device.type != "meta":
                    mod._parameters[attr] = nn.Parameter(p.detach().to("meta"), requires_grad=False)

    def stored_bytes(self, model: nn.Module) -> int:
        """The bytes of ``model``'s tensors (this checkpoint's model, cut or not; tied tensors once) as this checkpoint
        stores them (in :attr:`Checkpoint.cast` when set): what writing it takes at least."""
        total = 0
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            key = self._key_or_none(name)
            if key is not None:
                total += t.numel() * self.checkpoint.element_size(key)
        return total

    def layer_bytes(self, i: int) -> int:
        return sum(self.checkpoint.nbytes(self._key(k)) for _, _, k in self._owned(self.layers[i], self.prefixes[i]))

    def outside_layers(self) -> list[tuple[str, str]]:
        """(name in the model, checkpoint key) of the tensors that belong to no layer (embeddings, final norm,
        output head); a tensor the checkpoint lacks (an output head tied to the embeddings) is left out."""
        inside = tuple(f"{p}." for p in self.prefixes)
        out = []
        for name in self.model.state_dict():
            if name.startswith(inside):
                continue
            try:
                out.append((name, self._key(name)))
            except HeadcutError:
                continue
        return out

    # -- passes --------------------------------------------------------------------------------------------------

    def capture(
        self, batches: Sequence[dict[str, Any]], spill: Path | None
    ) -> tuple[Activations, list[list[tuple[tuple[Any, ...], dict[str, Any]]]]]:
        """The first layer's input and every layer's recorded call arguments, per batch (see the module's doc)."""
        base = self.model.base_model
        base_prefix = self._base_prefix()
        layer_ids = {id(m) for layer in self.layers for m in layer.modules()}
        outside = [(n, m) for n, m in base.named_children() if m is not self.layers and id(m) not in layer_ids]
        for name, child in outside:
            self.materialize(child, f"{base_prefix}{name}" if base_prefix else name, optional=True)
        calls: list[list[tuple[tuple[Any, ...], dict[str, Any]]]] = [[] for _ in self.layers]
        first = Activations(spill)
        held: list[torch.Tensor] = []
        originals = list(self.layers)
        n = len(originals)
        for i in range(n):
            self.layers[i] = _StandIn(calls[i], held, keep_input=i == 0, last=i == n - 1)
        accepts_cache = "use_cache" in inspect.signature(base.forward).parameters
        try:
            with torch.no_grad():
                for batch in batches:
                    inputs = {k: v for k, v in batch.items() if k not in ("labels", "_hc_index")}
                    if accepts_cache:
                        inputs["use_cache"] = False
                    try:
                        base(**inputs)
                    except _Stop:
                        pass
                    for t in held:
                        first.append(t)
                    held.clear()
        finally:
            for i, layer in enumerate(originals):
                self.layers[i] = layer
            for _, child in outside:
                self.release(child)
        if any(len(c) != len(batches) for c in calls):
            raise HeadcutError(
                "layer-wise pruning needs every layer to run once per forward; this model runs some "
                "layers more often or not at all: prune it without --layerwise"
            )
        return first, calls

    def _base_prefix(self) -> str:
        names = {id(m): n for n, m in self.model.named_modules()}
        name = names[id(self.model.base_model)]
        return f"{name}." if name else ""


@dataclass
class LayerwiseStats:
    """What a layer-wise run did: layers, the bytes of the largest layer, the activations (``memory`` or
    ``disk``, their bytes), the peak resident memory of the process and the time of each pass."""

    layers: int = 0
    layer_bytes: int = 0
    checkpoint_bytes: int = 0
    activations: str = "memory"
    activation_bytes: int = 0
    max_memory: int = 0
    reason: str = ""
    score_seconds: float = 0.0
    write_seconds: float = 0.0
    shards: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": "layerwise",
            "reason": self.reason,
            "layers": self.layers,
            "largest_layer_bytes": self.layer_bytes,
            "checkpoint_bytes": self.checkpoint_bytes,
            "activations": self.activations,
            "activation_bytes": self.activation_bytes,
            "max_memory_bytes": self.max_memory,
            "score_seconds": round(self.score_seconds, 2),
            "write_seconds": round(self.write_seconds, 2),
            "shards": self.shards,
            "peak_rss_bytes": peak_rss(),
        }


def activation_bytes(batches: Sequence[dict[str, Any]], width: int, element: int) -> int:
    """The bytes of one layer's activations (inputs or outputs) over ``batches``."""
    total = 0
    for batch in batches:
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor):
            total += ids.numel() * width * element
    return total
