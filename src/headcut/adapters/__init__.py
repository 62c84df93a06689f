"""Architecture adapters, one module per model family, and the lookup from a model to its adapter."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import HeadcutError
from .albert import AlbertAdapter
from .bart import BartAdapter
from .base import MISSING, Adapter, Block, BlockCut, CacheCost, EmptyStyle, Registry, Stack
from .bert import BertAdapter
from .deberta_v2 import DebertaV2Adapter
from .distilbert import DistilBertAdapter
from .gemma import GemmaAdapter
from .gemma4 import Gemma4Adapter
from .gpt2 import GPT2Adapter
from .gpt_neox import GPTNeoXAdapter
from .llama import LlamaAdapter
from .modernbert import ModernBertAdapter
from .olmo2 import Olmo2Adapter
from .phi3 import Phi3Adapter
from .qwen3 import Qwen3Adapter
from .qwen3_5 import Qwen35Adapter
from .smollm3 import SmolLM3Adapter
from .t5 import T5Adapter
from .vit import ViTAdapter

#: one adapter per family (one line each)
ADAPTERS: tuple[Adapter, ...] = (
    BertAdapter(),
    LlamaAdapter(),
    Qwen3Adapter(),
    Qwen35Adapter(),
    SmolLM3Adapter(),
    GemmaAdapter(),
    Gemma4Adapter(),
    Phi3Adapter(),
    Olmo2Adapter(),
    GPTNeoXAdapter(),
    ModernBertAdapter(),
    GPT2Adapter(),
    BartAdapter(),
    T5Adapter(),
    DistilBertAdapter(),
    AlbertAdapter(),
    DebertaV2Adapter(),
    ViTAdapter(),
)

_REGISTRY = Registry()
for _adapter in ADAPTERS:
    _REGISTRY.add(_adapter)


def supported_model_types() -> list[str]:
    """Model types (``config.model_type``) headcut can cut."""
    return sorted(_REGISTRY.adapters)


def adapter_for_model_type(model_type: Any) -> Adapter:
    """The adapter of a ``model_type`` (as config.json names it), or a one-line error naming the
    supported types."""
    adapter = _REGISTRY.adapters.get(model_type) if isinstance(model_type, str) else None
    if adapter is None:
        raise HeadcutError(f"unsupported architecture {model_type!r}; supported: {', '.join(supported_model_types())}")
    return adapter


def adapter_for_config(config: Any) -> Adapter:
    """The adapter of ``config.model_type``, or a one-line error naming the supported types."""
    adapter = adapter_for_model_type(getattr(config, "model_type", None))
    try:
        adapter.check_config(config)
    except ValueError as exc:
        raise HeadcutError(str(exc)) from None
    return adapter


def adapter_for(model: nn.Module) -> Adapter:
    return adapter_for_config(model.config)


def runtime_mixins() -> dict[str, type]:
    """Every adapter's runtime mixins by name."""
    out: dict[str, type] = {}
    for adapter in _REGISTRY.adapters.values():
        for mixin in adapter.runtime_mixins:
            out[mixin.__name__] = mixin
    return out


__all__ = [
    "MISSING",
    "Adapter",
    "Block",
    "BlockCut",
    "CacheCost",
    "EmptyStyle",
    "Stack",
    "adapter_for",
    "adapter_for_config",
    "adapter_for_model_type",
    "runtime_mixins",
    "supported_model_types",
]
