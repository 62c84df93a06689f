"""Safetensors files read and written tensor by tensor: a checkpoint's tensors read by name when asked, one
file written without building it in memory, and output shards of a bounded size with their index."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..devices import trim_memory
from ..errors import HeadcutError
from .checks import FLOATING, weight_files


class Checkpoint:
    """The safetensors tensors of a checkpoint folder by name, read when asked (files opened per read, so that
    nothing stays mapped)."""

    def __init__(self, folder: Path) -> None:
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
        if len({d for d in self.dtypes.values() if d in FLOATING}) <= 1:
            return None
        named = getattr(config, "dtype", None)
        if isinstance(named, str):
            named = getattr(torch, named, None)
        if isinstance(named, torch.dtype) and named.is_floating_point:
            return named
        first = next(iter(self.where.values()))
        return FLOAT_DTYPES[
            next((d for k, d in self.dtypes.items() if self.where[k] == first and d in FLOAT_DTYPES), "F32")
        ]


DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
#: safetensors' floating-point dtypes that transformers loads in one model dtype
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` as one safetensors file, tensor after tensor (safetensors' own ``save_file`` builds the
    whole file in memory first): an 8-byte little-endian header length, the JSON header (dtype, shape and byte
    offsets of each tensor, 8-byte aligned), then the raw little-endian bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in SAFETENSORS_DTYPES:
            raise HeadcutError(f"cannot write {name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for t in tensors.values():
            if t.numel():
                f.write(memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))


class ShardWriter:
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
