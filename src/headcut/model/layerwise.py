"""Layer-wise, memory-bounded pruning: a checkpoint read one layer at a time (``headcut prune --layerwise``).

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

Memory is one layer's weights (twice while it is cut), the embeddings while capturing, and the activations:
flat in the number of layers. Only scorers that need nothing but one layer's forward work layer-wise
(:data:`LAYERWISE_SCORERS`); the stack must be one list of layers that run once each, in order, and whose
tensors the checkpoint holds under the model's own names.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ..adapters import Adapter, Block, BlockCut, adapter_for, runtime_mixins
from ..errors import HeadcutError, label, shown
from .layer_cache import layer_stack
from .runtime import apply_ops

#: the scorers whose score of a block needs only its own layer's forward (or its weights)
LAYERWISE_SCORERS = ("fluctuation", "confidence", "entropy", "magnitude", "value-l1")
#: those of them that read attention maps (the layers then run with eager attention, the masks built for it)
MAP_SCORERS = ("confidence", "entropy")
#: the largest output shard (a shard is held in memory until it is written: a layer-wise run writes about one layer
#: per shard, so that this bound never sets its peak)
SHARD_BYTES = 2 * 1024**3


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key`` line of a ``/proc`` file (a size in kB), in bytes; None where there is no such file or line."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss() -> int:
    """The process's peak resident memory so far, in bytes: ``VmHWM`` of ``/proc/self/status`` where there is one
    (``getrusage``'s maximum also counts the parent's memory at the ``fork`` before this program started)."""
    peak = _proc_kib("/proc/self/status", "VmHWM:")
    if peak is not None:
        return peak
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)


def available_memory() -> int:
    """The memory headcut may use by default: the machine's available memory (``MemAvailable``), else its total."""
    available = _proc_kib("/proc/meminfo", "MemAvailable:")
    if available is not None:
        return available
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 1024**3


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


#: the largest size :func:`parse_size` takes (8 EiB: more than any machine's memory, and still a 64-bit count)
MAX_SIZE = 2**63


def parse_size(text: str | int) -> int:
    """Bytes from ``12GB``, ``12GiB``, ``500MB`` or a plain number of bytes (ASCII digits, at most
    :data:`MAX_SIZE`); HeadcutError otherwise."""
    value: int | float
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = text, ""
    else:
        s = str(text).strip().lower().replace(" ", "")
        digits = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        value_text, unit = digits, s[len(digits):]
        try:
            value = float(value_text) if value_text.isascii() else -1.0
        except ValueError:
            value = -1.0
        if unit not in _UNITS:
            value = -1.0
    if not (value > 0 and (isinstance(value, int) or math.isfinite(value)) and value * _UNITS[unit] <= MAX_SIZE):
        raise HeadcutError(f"{label('max_memory')} must be a size such as 12GB, 12GiB or 500MB, at most 8 EiB "
                           f"(got {shown(text)})")
    return int(value * _UNITS[unit])


def gib(n: int | float) -> str:
    return f"{n / 1024**3:.2f} GiB"


# ---- the checkpoint's tensors, read on demand ----------------------------------------------------------------

class Checkpoint:
    """The safetensors tensors of a checkpoint folder by name, read when asked (files opened per read, so that
    nothing stays mapped)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        from .checks import weight_files

        self.folder = folder
        self.where: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        #: the dtype floating-point tensors are read as (None: as stored); set for a checkpoint of mixed dtypes
        self.cast: torch.dtype | None = None
        files = weight_files(folder)
        if not files:
            raise HeadcutError(f"{folder} holds no safetensors weights: layer-wise pruning reads safetensors only")
        for f in files:
            with safe_open(f, "pt") as handle:
                for key in handle.keys():
                    sl = handle.get_slice(key)
                    self.where[key] = f
                    self.shapes[key] = tuple(sl.get_shape())
                    self.dtypes[key] = sl.get_dtype()

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The tensors ``names`` (a copy in memory, as stored; floating-point ones in :attr:`cast` when set)."""
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.where[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for f, keys in by_file.items():
            with safe_open(f, "pt") as handle:
                for key in keys:
                    t = handle.get_tensor(key)
                    cast = self.cast is not None and t.is_floating_point() and t.dtype != self.cast
                    out[key] = t.to(self.cast) if cast else t.clone()
        return out

    def element_size(self, name: str) -> int:
        """The bytes of one value of tensor ``name`` as it is read (:attr:`cast` applied)."""
        stored = self.dtypes[name]
        if self.cast is not None and stored in FLOAT_DTYPES:
            return self.cast.itemsize
        return DTYPE_BYTES.get(stored, 4)

    def nbytes(self, name: str) -> int:
        return math.prod(self.shapes[name]) * self.element_size(name)

    def working_dtype(self, config: Any) -> torch.dtype | None:
        """The one dtype a checkpoint whose floating-point tensors are stored in several dtypes is read in, as
        transformers' ``dtype="auto"`` loads it whole (the config's ``dtype``, else the first floating-point
        tensor's of the first weight file); None when they share one dtype (read as stored)."""
        from .checks import FLOATING

        if len({d for d in self.dtypes.values() if d in FLOATING}) <= 1:
            return None
        named = getattr(config, "dtype", None)
        if isinstance(named, str):
            named = getattr(torch, named, None)
        if isinstance(named, torch.dtype) and named.is_floating_point:
            return named
        first = next(iter(self.where.values()))
        return FLOAT_DTYPES[next((d for k, d in self.dtypes.items() if self.where[k] == first and d in FLOAT_DTYPES),
                                 "F32")]


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
#: safetensors' floating-point dtypes that transformers loads in one model dtype
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


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

    def __init__(self, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], first: list[torch.Tensor],
                 keep_input: bool, last: bool) -> None:
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


class _Activations:
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
            from safetensors.torch import load_file

            return load_file(item)["t"]
        return item

    def drop(self) -> None:
        for item in self.items:
            if isinstance(item, Path):
                item.unlink(missing_ok=True)
        self.items = []


class _LayerView(nn.Module):
    """One layer as the scorers see a model: ``base_model`` is the whole (mostly meta) model's, and a forward of
    calibration batch ``_hc_index`` runs only this layer, on its recorded inputs, keeping its output."""

    def __init__(self, layer: nn.Module, base: nn.Module, config: Any,
                 calls: list[tuple[tuple[Any, ...], dict[str, Any]]], inputs: _Activations, outputs: _Activations,
                 attention: Sequence[nn.Module] = ()) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "_base", base)
        self.config = config
        self.calls, self.inputs, self.outputs = calls, inputs, outputs
        object.__setattr__(self, "_attention", list(attention))

    @property
    def base_model(self) -> nn.Module:  # type: ignore[override]
        return self._base

    def forward(self, _hc_index: int, output_attentions: bool = False, **batch: Any) -> Any:
        """The layer on batch ``_hc_index``'s recorded input; with ``output_attentions``, an output whose
        ``attentions`` are the maps of the layer's attention modules (the weights each returns under eager
        attention), as a whole model's output has them."""
        if _hc_index != len(self.outputs):
            raise HeadcutError("layer-wise scoring: calibration batches must be run once each, in order")
        maps: list[torch.Tensor] = []
        handles = [mod.register_forward_hook(lambda m, a, out: maps.append(out[1])) for mod in self._attention] \
            if output_attentions else []
        try:
            args, kwargs = self.calls[_hc_index]
            out = self.layer(self.inputs[_hc_index], *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        hidden = out[0] if isinstance(out, tuple) else out
        self.outputs.append(hidden.detach())
        if output_attentions:
            return SimpleNamespace(last_hidden_state=hidden, attentions=tuple(maps))
        return hidden


def _renamed(model: nn.Module, keys: list[str]) -> dict[str, str]:
    """Model name -> checkpoint key for the checkpoint keys that transformers renames on loading (e.g. GPT-NeoX's
    ``embed_out`` -> ``lm_head``): its plain renamings of the model's class are applied; conversions that merge or
    split tensors are not (such tensors are then missing, and refused by name)."""
    import re

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
    import re

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
                raise HeadcutError(f"layer-wise pruning needs the attention blocks in one list of layers; {block.name} "
                                   "is in none")
            stacks[id(found[0])] = found[0]
            layer_of[block.name] = found[1]
        if len(stacks) != 1:
            raise HeadcutError(f"layer-wise pruning needs the attention blocks in one list of layers; "
                               f"{adapter.family} has {len(stacks)} (an encoder and a decoder): prune it without "
                               "--layerwise")
        shared = [b.name for b in blocks if b.shared]
        if shared:
            raise HeadcutError(f"layer-wise pruning cannot cut layers that share weights ({shared[0]}): prune "
                               f"{adapter.family} without --layerwise")
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
            "whose tensor names transformers converts on loading cannot be streamed: prune it without --layerwise)")

    def _check_names(self) -> None:
        for prefix, layer in zip(self.prefixes, self.layers):
            for name, _ in layer.named_parameters():
                self._key(f"{prefix}.{name}")

    def _check_tensors(self, new_head: bool = False) -> None:
        """Refuse what the whole-model loader refuses (:func:`headcut.model.checks.check_loading`), from the
        checkpoint's headers: a tensor the model needs that the checkpoint lacks (an output head tied to the
        embeddings excepted), one of another shape, or one the model does not use."""
        from .checks import check_dtypes, check_loading

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
        head = [name for name in missing if not name.startswith(prefix)] if self.model.base_model is not self.model else []
        if new_head and head:
            raise HeadcutError(f"{self.folder} has no {type(self.model).__name__} head ({', '.join(head[:4])}): a "
                               f"{label('layerwise')} run writes only the tensors the checkpoint holds, so it cannot add "
                               "a new task head; prune it without --layerwise")
        ignored = _ignored_unexpected(self.model)
        unexpected = [k for k in self.checkpoint.where if k not in used and not (ignored and ignored.search(k))]
        check_loading(self.model, {"missing_keys": missing, "unexpected_keys": unexpected,
                                   "mismatched_keys": mismatched}, self.folder, None)
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
                raise HeadcutError(f"{self.folder}: {key} is {tuple(t.shape)} but the config makes it "
                                   f"{tuple(current.shape)}")
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

    def capture(self, batches: Sequence[dict[str, Any]], spill: Path | None
                ) -> tuple[_Activations, list[list[tuple[tuple[Any, ...], dict[str, Any]]]]]:
        """The first layer's input and every layer's recorded call arguments, per batch (see the module's doc)."""
        import inspect

        base = self.model.base_model
        base_prefix = self._base_prefix()
        layer_ids = {id(m) for layer in self.layers for m in layer.modules()}
        outside = [(n, m) for n, m in base.named_children() if m is not self.layers and id(m) not in layer_ids]
        for name, child in outside:
            self.materialize(child, f"{base_prefix}{name}" if base_prefix else name, optional=True)
        calls: list[list[tuple[tuple[Any, ...], dict[str, Any]]]] = [[] for _ in self.layers]
        first = _Activations(spill)
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
            raise HeadcutError("layer-wise pruning needs every layer to run once per forward; this model runs some "
                               "layers more often or not at all: prune it without --layerwise")
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
        return {"path": "layerwise", "reason": self.reason, "layers": self.layers, "largest_layer_bytes": self.layer_bytes,
                "checkpoint_bytes": self.checkpoint_bytes, "activations": self.activations,
                "activation_bytes": self.activation_bytes, "max_memory_bytes": self.max_memory,
                "score_seconds": round(self.score_seconds, 2), "write_seconds": round(self.write_seconds, 2),
                "shards": self.shards, "peak_rss_bytes": peak_rss()}


def activation_bytes(batches: Sequence[dict[str, Any]], width: int, element: int) -> int:
    """The bytes of one layer's activations (inputs or outputs) over ``batches``."""
    total = 0
    for batch in batches:
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor):
            total += ids.numel() * width * element
    return total


def score_layerwise(streamed: StreamedModel, batches: Sequence[dict[str, Any]] | None, config: Any,
                    stats: LayerwiseStats, spill_dir: Path | None,
                    progress: Callable[[int, int], None] | None = None,
                    means: dict[str, torch.Tensor] | None = None) -> Any:
    """Scores of every block (a :class:`headcut.scoring.HeadScores`), computed one layer at a time; ``means``
    (fluctuation only): filled with each block's mean output-projection input (FLAP's baseline, for the bias
    compensation), from the same forward. An attention-map scorer runs the whole pass (the capture's masks
    included) with eager attention."""
    from ..scoring import finish_scores, get_scorer
    from ..scoring.attention_maps import eager_attention
    from ..scoring.base import RawScores

    scorer = get_scorer(config.scorer)
    if scorer.name not in LAYERWISE_SCORERS:
        raise HeadcutError(f"scorer {scorer.name} needs the whole model; layer-wise: {', '.join(LAYERWISE_SCORERS)}")
    start = time.perf_counter()
    by_layer: dict[int, list[Block]] = {}
    for block in streamed.blocks:
        by_layer.setdefault(streamed.layer_of[block.name], []).append(block)
    if spill_dir is not None:
        check_spill_room(spill_dir, stats.activation_bytes)
    with eager_attention(streamed.model) if scorer.name in MAP_SCORERS else contextlib.nullcontext():
        try:
            raw, examples = _score_layers(streamed, scorer, batches, config, spill_dir, progress, means, by_layer)
        except OSError as exc:
            if spill_dir is None:
                raise
            raise spill_error(exc, spill_dir, stats.activation_bytes) from None
    stats.score_seconds = time.perf_counter() - start
    return finish_scores(scorer, streamed.blocks, RawScores(raw, examples), config, stats.score_seconds)


def _score_layers(streamed: StreamedModel, scorer: Any, batches: Sequence[dict[str, Any]] | None, config: Any,
                  spill_dir: Path | None, progress: Callable[[int, int], None] | None,
                  means: dict[str, torch.Tensor] | None, by_layer: dict[int, list[Block]]
                  ) -> tuple[dict[str, torch.Tensor], int]:
    """The raw scores of :func:`score_layerwise`, layer after layer."""
    from ..scoring.fluctuation import input_moments, scores_from_moments

    base = streamed.model.base_model
    raw: dict[str, torch.Tensor] = {}
    examples = 0
    n = len(streamed.layers)
    if scorer.needs_data:
        if not batches:
            raise HeadcutError(f"scorer {scorer.name} needs calibration data")
        indexed = [dict(b, _hc_index=i) for i, b in enumerate(batches)]
        current, calls = streamed.capture(batches, spill_dir)
    for i in range(n):
        streamed.materialize(streamed.layers[i], streamed.prefixes[i])
        try:
            blocks = by_layer.get(i, [])
            if scorer.needs_data:
                outputs = _Activations(spill_dir)
                attention = [base.get_submodule(b.attn) for b in sorted(blocks, key=lambda b: b.layer)]
                view = _LayerView(streamed.layers[i], base, streamed.model.config, calls[i], current, outputs,
                                  attention)
                if blocks and means is not None and scorer.name == "fluctuation":
                    moments, examples = input_moments(view, blocks, indexed, scorer.name)
                    raw.update(scores_from_moments(view, blocks, moments, examples).blocks)
                    means.update({name: m.mean() for name, m in moments.items()})
                elif blocks:
                    result = scorer.fn(view, blocks, indexed, config, None)
                    raw.update(result.blocks)
                    examples = result.examples
                with torch.no_grad():
                    for j in range(len(outputs), len(batches)):  # a layer without blocks still passes its outputs on
                        view(_hc_index=j)
                current.drop()
                current = outputs
                calls[i] = []
            elif blocks:
                raw.update(scorer.fn(streamed.model, blocks, None, config, None).blocks)
        finally:
            streamed.release(streamed.layers[i])
            trim_memory()
        if progress is not None:
            progress(i + 1, n)
    if scorer.needs_data:
        current.drop()
    return raw, examples


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                       torch.bool: "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` as one safetensors file, tensor after tensor (safetensors' own ``save_file`` builds the
    whole file in memory first): an 8-byte little-endian header length, the JSON header (dtype, shape and byte
    offsets of each tensor, 8-byte aligned), then the raw little-endian bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise HeadcutError(f"cannot write {name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for t in tensors.values():
            if t.numel():
                f.write(memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))


def trim_memory() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; elsewhere nothing): a layer's tensors
    are freed after each step, and without it the process's resident size keeps their high-water mark."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


class _ShardWriter:
    """Tensors written to ``model-XXXXX-of-YYYYY.safetensors`` shards of at most ``limit`` bytes (a larger tensor
    gets a shard of its own), with their index."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder, self.limit = folder, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.size + nbytes > self.limit:
            self.flush()
        self.pending[name] = tensor.detach().contiguous()
        self.size += nbytes
        self.total += nbytes

    def flush(self) -> None:
        if not self.pending:
            return
        path = self.folder / f"shard-{len(self.files):05d}.tmp"
        write_safetensors(path, self.pending)
        self.files.append((path, list(self.pending)))
        self.pending, self.size = {}, 0
        trim_memory()

    def finish(self) -> int:
        """Name the shards and write the index (one file: ``model.safetensors``, no index); returns the count."""
        self.flush()
        count = len(self.files)
        if count == 1:
            self.files[0][0].rename(self.folder / "model.safetensors")
            return 1
        weight_map: dict[str, str] = {}
        for i, (path, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            path.rename(self.folder / final)
            weight_map.update({n: final for n in names})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return count


def write_layerwise(streamed: StreamedModel, cuts: dict[str, BlockCut], folder: Path, stats: LayerwiseStats,
                    shard_bytes: int = SHARD_BYTES, progress: Callable[[int, int], None] | None = None,
                    before_cut: Callable[[int], None] | None = None,
                    after_cut: Callable[[int], None] | None = None) -> None:
    """Cut every layer of ``streamed`` by ``cuts`` and write all tensors as safetensors shards into ``folder``
    (an existing empty folder); afterwards the meta model carries the cut (shapes, record in its config).
    ``before_cut(i)`` / ``after_cut(i)``: called with layer ``i``'s weights in memory, before its cut and before it
    is written."""
    from .surgery import _compose, block_ops, build_record

    start = time.perf_counter()
    model, adapter = streamed.model, streamed.adapter
    base = model.base_model
    ops = block_ops(adapter, base, streamed.blocks, cuts)
    rel = [p.removeprefix(streamed._base_prefix()) for p in streamed.prefixes]
    per_layer: list[list[dict[str, Any]]] = [[] for _ in streamed.layers]
    for op in ops:
        index = next((i for i, p in enumerate(rel) if op["path"] == p or op["path"].startswith(p + ".")), None)
        if index is None:
            raise HeadcutError(f"layer-wise pruning: the cut changes {op['path']}, outside the layers")
        per_layer[index].append(op)
    # shards of about one layer: the writer holds a shard in memory until it is written
    limit = min(shard_bytes, max(streamed.layer_bytes(i) for i in range(len(streamed.layers))))
    writer = _ShardWriter(folder, limit)
    outside = streamed.outside_layers()
    for start_at in range(0, len(outside), 64):
        part = dict(outside[start_at:start_at + 64])
        tensors = streamed.checkpoint.read(list(part.values()))
        for name, key in part.items():
            writer.add(name, tensors[key])
    mixins = runtime_mixins()
    n = len(streamed.layers)
    for i, layer in enumerate(streamed.layers):
        streamed.materialize(layer, streamed.prefixes[i])
        try:
            if before_cut is not None:
                before_cut(i)
            apply_ops(base, per_layer[i], mixins)
            if after_cut is not None:
                after_cut(i)
            for name, t in layer.state_dict().items():
                writer.add(f"{streamed.prefixes[i]}.{name}", t)
        finally:
            streamed.release(layer)
        if writer.size >= limit:
            writer.flush()
        if progress is not None:
            progress(i + 1, n)
    stats.shards = writer.finish()
    previous = getattr(model.config, "headcut", None)
    model.config.headcut = build_record(model, adapter, _compose(previous, streamed.blocks, cuts))
    stats.write_seconds = time.perf_counter() - start


def spill_need(activation_bytes: int) -> int:
    """The disk a spilling run needs for its activations: one layer's inputs and outputs at once."""
    return 2 * activation_bytes


def _spill_hint() -> str:
    return (f"set TMPDIR to a folder with more room, give {label('max_memory')} room to keep the activations in "
            f"memory, or use fewer {label('max_examples')}")


def check_spill_room(folder: Path, activation_bytes: int) -> None:
    """Refuse, before scoring, to spill activations to ``folder`` when its disk cannot hold them."""
    from ..files.space import free_space, space_error

    free, need = free_space(folder), spill_need(activation_bytes)
    if free is not None and free < need:
        raise space_error("spill activations to", folder.parent, folder.parent, need, _spill_hint())


def spill_error(exc: OSError, folder: Path, activation_bytes: int) -> HeadcutError:
    """The one-line error of activations that could not be spilled to ``folder`` (a full disk, most likely), naming
    the temporary folder the user chose (TMPDIR), not headcut's scratch folder in it."""
    from ..files.space import write_error

    where = folder.parent
    error = write_error(exc, "spill activations to", where, where, spill_need(activation_bytes) or None,
                        _spill_hint())
    return error if error is not None else HeadcutError(f"cannot spill activations to {where}: {exc}")


def spill_folder(parent: Path | None) -> Any:
    """A private temporary folder for spilled activations, ``headcut-activations-PID-*`` (removed afterwards; those a
    killed run left are removed first)."""
    from ..files.leftovers import scratch_folder

    return scratch_folder("activations", parent)
