"""The configuration class of the DeciLM / Nemotron-NAS checkpoints headcut writes (``--format decilm``), copied
into each such folder as ``configuration_decilm.py`` and named by its ``auto_map``: engines that read the layout
(vLLM's ``DeciLMForCausalLM``) load it with ``trust_remote_code``. headcut's own code, written for the fields
those engines read; it imports only transformers (it runs where headcut is not installed).

A Llama configuration plus ``block_configs``: one entry per layer, ``{"attention": {"n_heads_in_group": g,
"no_op": bool, ...}, "ffn": {"intermediate_size": n, "no_op": bool, ...}}``, read as objects with attributes
(``config.block_configs[i].attention.no_op``) and written back as plain dicts. A layer's KV heads are
``num_attention_heads // n_heads_in_group``; ``head_dim`` is explicit, so ``hidden_size`` need not be a multiple
of the head count.
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig


class BlockPart:
    """The ``attention`` or ``ffn`` entry of one layer: its fields as attributes."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BlockConfig:
    """One layer's entry of ``block_configs``."""

    def __init__(self, attention: Any = None, ffn: Any = None, **extra: Any) -> None:
        self.attention = attention if isinstance(attention, BlockPart) else BlockPart(**(attention or {}))
        self.ffn = ffn if isinstance(ffn, BlockPart) else BlockPart(**(ffn or {}))
        self.__dict__.update(extra)

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.to_dict() if isinstance(v, BlockPart) else v) for k, v in self.__dict__.items()}


class DeciLMConfig(LlamaConfig):
    """A Llama configuration whose layers differ (``block_configs``)."""

    model_type = "nemotron-nas"

    def __post_init__(self, **kwargs: Any) -> None:
        blocks = kwargs.pop("block_configs", None)
        super().__post_init__(**kwargs)
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig(**b) for b in (blocks or [])]

    def validate_architecture(self) -> None:
        """LlamaConfig wants ``hidden_size`` a multiple of the head count; with an explicit ``head_dim`` (always
        written here) nothing reads that."""

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["block_configs"] = [b.to_dict() for b in self.block_configs]
        return out
