"""ONNX export of (slimmed) models, checked against PyTorch in onnxruntime, and an onnxruntime runner.

:func:`export_onnx` writes ``model.onnx`` (weights inside; a ``model.onnx.data`` file beside it when
they exceed 2 GB) with torch's ``torch.export``-based exporter (``dynamo=True``), opset
:data:`OPSET`, always in float32 on the CPU (a float16/bfloat16 or CUDA model is exported from a float32
CPU copy). Batch and sequence axes are dynamic. Per-layer head counts may differ; the graph holds each
layer's own widths.

Graph inputs and outputs (int64 ids and masks, float32 tensors):

* encoders (BERT, RoBERTa, DistilBERT, DeBERTa-v2, ALBERT, ELECTRA, ...) and decoders that do not
  generate (``*ForSequenceClassification``): inputs ``input_ids`` (batch, sequence),
  ``attention_mask`` (batch, sequence) and ``token_type_ids`` (batch, sequence) when the model has
  token types; image models ``pixel_values`` (batch, channels, height, width) instead.
  Outputs: the task's tensors by their transformers names (``logits``; ``start_logits`` and
  ``end_logits``; ``last_hidden_state`` and ``pooler_output`` for a base model).
* decoders that generate (GPT-2, Llama, Qwen2, Mistral ``*ForCausalLM`` / ``*LMHeadModel``), one graph
  for the prompt (past length 0) and for every later step: inputs ``input_ids`` (batch, sequence),
  ``attention_mask`` (batch, past_sequence + sequence), ``position_ids`` (batch, sequence) and, for
  each layer ``i``, ``past_key_values.{i}.key`` / ``past_key_values.{i}.value`` (batch, kv_heads_i,
  past_sequence, head_dim_i). Outputs ``logits`` (batch, sequence, vocab) and
  ``present.{i}.key`` / ``present.{i}.value`` (batch, kv_heads_i, past_sequence + sequence,
  head_dim_i): the next step's past. A layer whose every head was removed keeps a placeholder
  entry of shape (batch, 1, past_sequence, 1) so that positions stay right. The first step gets
  pasts of length 0; ``position_ids`` are ``cumsum(attention_mask) - 1`` (left padding works).

Encoder-decoder models (BART, Marian, T5) are refused: generation needs separate encoder and
decoder graphs, which this module does not write.

:class:`OnnxRunner` opens such a file in onnxruntime (CPU, or CUDA) and fills what a caller leaves
out (token types, position ids, empty pasts); ``headcut bench --runtime onnxruntime`` uses it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...adapters.runtime import CACHE_KEYWORDS, returned_cache
from ...errors import HeadcutError
from ...extras import imported, installed
from ...model.surgery import weights_bytes

#: the largest max abs difference from PyTorch (float32) an export may have
ONNX_TOLERANCE = 1e-4
ONNX_FILE = "model.onnx"
OPSET = 18
#: weights above this many bytes go to an external data file (protobuf's limit is 2 GiB)
EXTERNAL_DATA_BYTES = 2_000_000_000
EXTRA_HINT = "pip install 'headcut[onnx]' (onnx, onnxscript, onnxruntime)"
#: output fields of a transformers forward that are not exported
_SKIPPED_OUTPUTS = ("loss", *CACHE_KEYWORDS, "hidden_states", "attentions", "cross_attentions")


@dataclass
class OnnxExport:
    """What :func:`export_onnx` wrote (``file`` relative to the folder) and how well it matches PyTorch."""

    file: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    external_data: bool
    parity: float | None
    checked_with: str | None
    seconds: float
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def missing_modules(runtime: bool = False) -> list[str]:
    """The modules of the onnx extra that are not installed (the exporter's, or onnxruntime)."""
    names = ("onnxruntime",) if runtime else ("onnx", "onnxscript")
    return [n for n in names if not installed(n)]


def require_onnxruntime(why: str = "this") -> Any:
    """``import onnxruntime`` or a one-line HeadcutError naming the extra."""
    if missing_modules(runtime=True):
        raise HeadcutError(f"{why} needs onnxruntime: {EXTRA_HINT}")
    return imported("onnxruntime", why, EXTRA_HINT)


# ---- what the graph takes and returns -------------------------------------------------------------------


@dataclass
class _Spec:
    kind: str  # "text", "image" or "decoder"
    inputs: list[str]
    outputs: list[str]  # the model's output fields (presents not included)
    layers: int = 0  # cached layers of a decoder


def _accepts(model: nn.Module, name: str) -> bool:

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _vocab(model: nn.Module) -> int:
    emb = model.get_input_embeddings()
    return int(getattr(emb, "num_embeddings", 0) or model.config.get_text_config().vocab_size)


def check_onnx(model: nn.Module) -> None:
    """Refuse, in one line, what :func:`export_onnx` cannot write (before any long work)."""
    missing = missing_modules()
    if missing:
        raise HeadcutError(f"ONNX export needs the onnx extra ({', '.join(missing)} missing): {EXTRA_HINT}")
    for name in ("onnx", "onnxscript"):
        imported(name, "ONNX export", EXTRA_HINT)
    major_minor = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if major_minor < (2, 6):
        raise HeadcutError(
            f"ONNX export needs torch >= 2.6 (its torch.export-based exporter); this is torch {torch.__version__}"
        )
    cfg = model.config
    name = type(model).__name__.removeprefix("Headcut")
    if getattr(cfg, "is_encoder_decoder", False):
        raise HeadcutError(
            f"ONNX export of encoder-decoder models ({name}) is not supported: their generation "
            "needs separate encoder and decoder graphs"
        )
    main = getattr(model, "main_input_name", "input_ids")
    if main not in ("input_ids", "pixel_values"):
        raise HeadcutError(f"ONNX export takes token or image models; {name} takes {main!r}")


def _generates(model: nn.Module) -> bool:
    return bool(getattr(model, "can_generate", lambda: False)()) and _cache_keyword(model) is not None


def _cache_keyword(model: nn.Module) -> str | None:
    """The keyword the model's forward takes its KV cache under (``cache`` or ``past_key_values``), or None."""
    return next((k for k in CACHE_KEYWORDS if _accepts(model, k)), None)


def _spec(model: nn.Module) -> _Spec:
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        kind, inputs = "image", ["pixel_values"]
    else:
        kind = "decoder" if _generates(model) else "text"
        inputs = ["input_ids", "attention_mask"]
        if getattr(model.config, "type_vocab_size", 0) and _accepts(model, "token_type_ids"):
            inputs.append("token_type_ids")
        if kind == "decoder":
            inputs.append("position_ids")
    sample = _sample(model, kind, inputs, batch=1, length=2)
    kwargs = {"use_cache": kind == "decoder"} if _accepts(model, "use_cache") else {}
    with torch.no_grad():
        out = model(**sample, **kwargs, return_dict=True)
    outputs = [
        k
        for k, v in out.items()
        if isinstance(v, torch.Tensor) and k not in _SKIPPED_OUTPUTS and not k.startswith(("encoder_", "decoder_"))
    ]
    if not outputs:
        raise HeadcutError(f"{type(model).__name__}: its forward returns no tensor to export")
    layers = 0
    if kind == "decoder":
        cache = returned_cache(out)
        if cache is None or not hasattr(cache, "layers"):
            raise HeadcutError(f"ONNX export: {type(model).__name__} returns no transformers KV cache")
        layers = len(cache.layers)
    return _Spec(kind, inputs, outputs, layers)


def _positions(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Position ids of the last ``length`` tokens from a (left- or right-) padded mask."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)[:, -length:]


def _sample(
    model: nn.Module,
    kind: str,
    inputs: list[str],
    batch: int,
    length: int,
    lengths: list[int] | None = None,
    left: bool = False,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inputs of the model's forward (no cache): random ids, padded to ``lengths`` if given."""
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        cfg = model.config
        size = cfg.image_size if isinstance(cfg.image_size, int) else tuple(cfg.image_size)[-1]
        return {"pixel_values": torch.randn(batch, int(getattr(cfg, "num_channels", 3)), size, size, generator=g)}
    vocab = _vocab(model)
    low = 3 if vocab > 3 else 0
    ids = torch.randint(low, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i, n in enumerate(lengths or []):
        if left:
            mask[i, : length - n] = 0
        else:
            mask[i, n:] = 0
    pad = model.config.get_text_config().pad_token_id
    ids = ids.masked_fill(mask == 0, pad if isinstance(pad, int) else 0)
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inputs:
        types = torch.zeros_like(ids)
        types[:, length // 2 :] = 1
        out["token_type_ids"] = types.masked_fill(mask == 0, 0)
    if "position_ids" in inputs:
        out["position_ids"] = _positions(mask, length)
    return out


def _cache(config: Any, pasts: list[torch.Tensor]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for i in range(len(pasts) // 2):
        cache.update(pasts[2 * i], pasts[2 * i + 1], i)
    return cache


class _Graph(nn.Module):
    """The model as a function of flat tensors (what the exporter traces)."""

    def __init__(self, model: nn.Module, spec: _Spec) -> None:
        super().__init__()
        self.model = model
        self.spec = spec

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.spec.inputs)
        kwargs: dict[str, Any] = dict(zip(self.spec.inputs, args[:n]))
        if self.spec.kind == "decoder":
            kwargs[_cache_keyword(self.model) or "past_key_values"] = _cache(self.model.config, list(args[n:]))
            kwargs["use_cache"] = True
        elif _accepts(self.model, "use_cache"):
            kwargs["use_cache"] = False
        out = self.model(**kwargs, return_dict=True)
        result = [out[k] for k in self.spec.outputs]
        if self.spec.kind == "decoder":
            for layer in returned_cache(out).layers:
                result += [layer.keys, layer.values]
        return tuple(result)


def cache_names(layers: int, prefix: str = "past_key_values") -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _past_shapes(model: nn.Module, spec: _Spec) -> list[tuple[int, int]]:
    """(heads, head_dim) of each cached key and value tensor, in graph order."""
    sample = _sample(model, "decoder", spec.inputs, batch=1, length=2)
    with torch.no_grad():
        cache = returned_cache(model(**sample, use_cache=True, return_dict=True))
    return [(int(t.shape[1]), int(t.shape[3])) for layer in cache.layers for t in (layer.keys, layer.values)]


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's warnings and log lines (torchvision missing, deprecations) off the terminal."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _export_message(exc: BaseException) -> str:
    """The first line of an exporter error that says something (not its banner or a traceback header)."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not line.startswith(("Failed to export the model with torch.export", "Traceback")):
            return line.replace("\x1b[96m", "").replace("\x1b[0m", "")
    return type(exc).__name__


def _export_copy(model: nn.Module) -> nn.Module:
    """The model itself when it is float32 on the CPU, else a float32 CPU copy."""
    params = list(model.parameters())
    if all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params):
        return model
    return copy.deepcopy(model).to(device="cpu", dtype=torch.float32)


def export_onnx(model: nn.Module, folder: Path, *, check: bool = True) -> OnnxExport:
    """Write ``folder/model.onnx`` for ``model`` (see the module docstring for its inputs and outputs).

    With ``check`` and onnxruntime installed, a padded batch (and, for decoders, a cached step after
    it) runs through onnxruntime (CPU) and through the PyTorch model; ``parity`` is the max abs
    difference of the first output over the non-padded positions, and above :data:`ONNX_TOLERANCE`
    the export is refused with a HeadcutError."""
    check_onnx(model)
    start = time.perf_counter()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ONNX_FILE
    source = _export_copy(model)
    was_training = source.training
    source.eval()
    try:
        spec = _spec(source)
        names_in, names_out, args, shapes = _trace_inputs(source, spec)
        external = weights_bytes(source) > EXTERNAL_DATA_BYTES
        for stale in (path, folder / (ONNX_FILE + ".data")):
            stale.unlink(missing_ok=True)
        name = type(source).__name__.removeprefix("Headcut")
        with _quiet_exporter(), torch.no_grad():
            try:
                program = torch.onnx.export(
                    _Graph(source, spec),
                    args,
                    dynamo=True,
                    input_names=names_in,
                    output_names=names_out,
                    dynamic_shapes=(tuple(shapes),),
                    opset_version=OPSET,
                    verbose=False,
                    optimize=True,
                )
            except Exception as exc:  # the exporter raises many kinds; the first line says what failed
                raise HeadcutError(f"ONNX export of {name} failed: {_export_message(exc)}") from None
            program.save(str(path), external_data=external)
        import onnx

        onnx.checker.check_model(str(path))
        parity, checked_with = None, None
        if check and not missing_modules(runtime=True):
            require_onnxruntime("checking the ONNX export")
            parity, checked_with = _parity(source, spec, folder)
            if not parity <= ONNX_TOLERANCE:
                raise HeadcutError(
                    f"the ONNX export of {name} does not match PyTorch: max abs difference {parity:.2e} > "
                    f"{ONNX_TOLERANCE:.0e} in {checked_with}"
                )
    finally:
        source.train(was_training)
    return OnnxExport(
        file=ONNX_FILE,
        opset=OPSET,
        inputs=names_in,
        outputs=names_out,
        external_data=(folder / (ONNX_FILE + ".data")).exists(),
        parity=parity,
        checked_with=checked_with,
        seconds=time.perf_counter() - start,
    )


def _trace_inputs(model: nn.Module, spec: _Spec) -> tuple[list[str], list[str], tuple, list[dict[int, Any]]]:
    """Input and output names, example arguments and their dynamic axes for the exporter."""
    from torch.export import Dim

    batch, seq = Dim("batch"), Dim("sequence")
    if spec.kind == "image":
        args = _sample(model, "image", spec.inputs, batch=2, length=0)
        return spec.inputs, spec.outputs, (args["pixel_values"],), [{0: batch}]
    # sizes >= 2 and all different: torch.export specialises sizes 0 and 1
    length, past = 3, 5
    sample = _sample(model, spec.kind, spec.inputs, batch=2, length=length)
    if spec.kind != "decoder":
        return (
            spec.inputs,
            spec.outputs,
            tuple(sample[k] for k in spec.inputs),
            [{0: batch, 1: seq} for _ in spec.inputs],
        )
    past_len, total = Dim("past_sequence"), Dim("total_sequence")
    pasts = [torch.randn(2, h, past, d) for h, d in _past_shapes(model, spec)]
    sample["attention_mask"] = torch.ones(2, past + length, dtype=torch.long)
    sample["position_ids"] = torch.arange(past, past + length).expand(2, length).contiguous()
    axes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "token_type_ids": {0: batch, 1: seq},
        "position_ids": {0: batch, 1: seq},
    }
    names_in = spec.inputs + cache_names(spec.layers)
    names_out = spec.outputs + cache_names(spec.layers, "present")
    args = tuple(sample[k] for k in spec.inputs) + tuple(pasts)
    shapes = [axes[k] for k in spec.inputs] + [{0: batch, 2: past_len} for _ in pasts]
    return names_in, names_out, args, shapes


# ---- parity ------------------------------------------------------------------------------------------------


def _padded(model: nn.Module, spec: _Spec) -> dict[str, torch.Tensor]:
    """Two sequences of different lengths (left padding for decoders, right for encoders)."""
    if spec.kind == "image":
        return _sample(model, "image", spec.inputs, batch=2, length=0, seed=1)
    return _sample(
        model, spec.kind, spec.inputs, batch=2, length=7, lengths=[7, 4], left=spec.kind == "decoder", seed=1
    )


def _max_diff(ref: torch.Tensor, got: Any, mask: torch.Tensor | None) -> float:
    got_t = torch.as_tensor(got, dtype=ref.dtype)
    if tuple(got_t.shape) != tuple(ref.shape):
        return float("inf")
    diff = (ref - got_t).abs()
    if mask is not None and diff.dim() >= 2 and tuple(diff.shape[:2]) == tuple(mask.shape):
        diff = diff[mask.bool()]
    return float(diff.max()) if diff.numel() else 0.0


def _parity(model: nn.Module, spec: _Spec, folder: Path) -> tuple[float, str]:
    """Max abs difference of the first output between onnxruntime (CPU) and PyTorch."""
    runner = OnnxRunner(folder / ONNX_FILE, threads=torch.get_num_threads())
    batch = _padded(model, spec)
    mask = batch.get("attention_mask")
    kwargs = {"use_cache": spec.kind == "decoder"} if _accepts(model, "use_cache") else {}
    with torch.no_grad():
        ref = model(**batch, **kwargs, return_dict=True)
    got = runner.run({k: v.numpy() for k, v in batch.items()})
    worst = _max_diff(ref[spec.outputs[0]], got[spec.outputs[0]], mask)
    if spec.kind == "decoder":  # two cached steps, feeding the presents back
        cache, ids = returned_cache(ref), ref.logits[:, -1].argmax(-1, keepdim=True)
        presents = runner.presents(got)
        for _ in range(2):
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            step = {"input_ids": ids, "attention_mask": mask, "position_ids": _positions(mask, 1)}
            with torch.no_grad():
                ref = model(
                    **step, **{_cache_keyword(model) or "past_key_values": cache}, use_cache=True, return_dict=True
                )
            got = runner.run({k: v.numpy() for k, v in step.items()}, past=presents)
            worst = max(worst, _max_diff(ref.logits, got["logits"], None))
            cache, ids, presents = returned_cache(ref), ref.logits[:, -1].argmax(-1, keepdim=True), runner.presents(got)
    return worst, runner.version


# ---- running a file in onnxruntime ---------------------------------------------------------------------------

_NP_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bfloat16)": "bfloat16",
}


class OnnxRunner:
    """An onnxruntime session of a ``model.onnx`` headcut wrote (see the module docstring).

    ``device``: ``cpu`` or ``cuda`` / ``cuda:N`` (CUDAExecutionProvider, refused in one line when this
    onnxruntime has none). ``threads``: intra-op threads (default: onnxruntime's)."""

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        ort = require_onnxruntime("running an ONNX model")
        self.path = Path(path)
        if not self.path.is_file():
            raise HeadcutError(f"ONNX model not found: {self.path}")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise HeadcutError(
                    f"--device {device} with onnxruntime needs its CUDAExecutionProvider, which this onnxruntime "
                    f"({ort.__version__}: {', '.join(ort.get_available_providers())}) lacks: "
                    "pip install onnxruntime-gpu"
                )
            index = int(device.split(":")[1]) if ":" in device else 0
            providers: list[Any] = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise HeadcutError(f"onnxruntime cannot load {self.path}: {_export_message(exc)}") from None
        self.device = device
        self.version = f"onnxruntime {ort.__version__}"
        self.threads = threads
        self._inputs = {i.name: i for i in self.session.get_inputs()}
        self.inputs = list(self._inputs)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.past_names = [n for n in self.inputs if n.startswith("past_key_values.")]
        self.decoder = bool(self.past_names)

    @property
    def dtype(self) -> str:
        """The numpy name of the first output's element type (``float32``)."""
        return _NP_TYPES.get(self.session.get_outputs()[0].type, self.session.get_outputs()[0].type)

    def empty_past(self, batch: int) -> dict[str, Any]:
        """Pasts of length 0 (the first step)."""
        import numpy as np

        out = {}
        for name in self.past_names:
            shape = self._inputs[name].shape
            out[name] = np.zeros((batch, int(shape[1]), 0, int(shape[3])), dtype=_NP_TYPES[self._inputs[name].type])
        return out

    def feeds(self, inputs: Mapping[str, Any], past: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """numpy feeds for the session: ``inputs`` (numpy or torch tensors) plus zero token types,
        position ids from the attention mask and the ``past`` (default: empty) that the graph takes."""
        import numpy as np

        feeds = {
            k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in inputs.items()
            if k in self._inputs
        }
        unknown = sorted(set(inputs) - set(self._inputs))
        if unknown:
            raise HeadcutError(f"{self.path} takes no input {unknown[0]!r} (inputs: {', '.join(self.inputs)})")
        main = feeds.get("input_ids")
        if main is not None:
            if "token_type_ids" in self._inputs and "token_type_ids" not in feeds:
                feeds["token_type_ids"] = np.zeros_like(main)
            if "attention_mask" in self._inputs and "attention_mask" not in feeds:
                feeds["attention_mask"] = np.ones_like(main)
            if "position_ids" in self._inputs and "position_ids" not in feeds:
                mask = feeds["attention_mask"].astype(np.int64)
                pos = mask.cumsum(-1) - 1
                pos[mask == 0] = 1
                feeds["position_ids"] = pos[:, -main.shape[1] :]
        if self.decoder:
            feeds.update(past if past is not None else self.empty_past(len(next(iter(feeds.values())))))
        for name, value in feeds.items():
            want = _NP_TYPES.get(self._inputs[name].type)
            if want and want != "bfloat16" and value.dtype != want:
                feeds[name] = value.astype(want)
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise HeadcutError(f"{self.path} needs input {missing[0]!r}")
        return feeds

    def run(self, inputs: Mapping[str, Any], past: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one forward; ``{output name: numpy array}``."""
        values = self.session.run(None, self.feeds(inputs, past))
        return dict(zip(self.outputs, values))

    def prepare(self, feeds: Mapping[str, Any]) -> Callable[[], Any]:
        """A call that runs ``feeds`` (from :meth:`feeds`) again and again: on CUDA the inputs are copied
        to the device once and the outputs stay there (an IO binding)."""
        if not self.device.startswith("cuda"):
            fixed = dict(feeds)
            return lambda: self.session.run(None, fixed)
        import onnxruntime as ort

        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        binding = self.session.io_binding()
        values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", index) for k, v in feeds.items()}
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.outputs:
            binding.bind_output(name, "cuda", index)

        def call() -> Any:
            self.session.run_with_iobinding(binding)
            return values  # keeps the device inputs alive as long as the call

        return call

    def presents(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """The ``present.*`` outputs of a step as the next step's ``past_key_values.*`` feeds."""
        return {
            "past_key_values." + k.removeprefix("present."): v for k, v in outputs.items() if k.startswith("present.")
        }

    def generate(self, input_ids: Any, attention_mask: Any, new_tokens: int) -> tuple[Any, dict[str, Any]]:
        """Greedy decoding of exactly ``new_tokens`` tokens with the KV cache; returns the new tokens
        (batch, new_tokens) and the last step's presents (prompt + new_tokens - 1 positions)."""
        import numpy as np

        if not self.decoder:
            raise HeadcutError(f"{self.path} has no KV-cache inputs: it does not generate")
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.asarray(attention_mask, dtype=np.int64)
        out = self.run({"input_ids": ids, "attention_mask": mask})
        tokens = []
        for step in range(new_tokens):
            nxt = out["logits"][:, -1].argmax(-1).astype(np.int64)[:, None]
            tokens.append(nxt)
            if step == new_tokens - 1:
                break
            mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
            out = self.run({"input_ids": nxt, "attention_mask": mask}, past=self.presents(out))
        return (np.concatenate(tokens, axis=1) if tokens else np.zeros((len(ids), 0), np.int64)), {
            k: v for k, v in out.items() if k.startswith("present.")
        }


def load_session(folder: str | Path, device: str = "cpu", threads: int | None = None) -> OnnxRunner:
    """An :class:`OnnxRunner` of ``folder/model.onnx`` (or of the ``.onnx`` file given)."""
    path = Path(folder)
    return OnnxRunner(path if path.suffix == ".onnx" else path / ONNX_FILE, device=device, threads=threads)


__all__ = [
    "EXTERNAL_DATA_BYTES",
    "ONNX_FILE",
    "ONNX_TOLERANCE",
    "OPSET",
    "OnnxExport",
    "OnnxRunner",
    "check_onnx",
    "export_onnx",
    "load_session",
    "missing_modules",
    "require_onnxruntime",
]
