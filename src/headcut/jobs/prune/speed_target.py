"""``--target-speedup X``: a budget in measured decode speed, found by timing candidate cuts on the device.

The speed-up of a decoder at a long context is what users buy, and no count predicts it (weights, attention over
the cache and the kernels' shapes all move it). So it is measured: the method's scores are taken once (a one-shot
score-based method), and for KV-cache budgets ``F`` on a ladder (0.9, 0.8, ..., 0.1, those the units can reach)
the cut ``--kv-budget F`` would make (:mod:`headcut.pruning.costs`, the same allocation and refinement, so the
same heads) is made on a copy of the model and timed against the unpruned model on ``--device``:

* each model holds a cache of ``context - 1`` positions, prefilled once from random token ids (in chunks of
  :data:`CHUNK` tokens, the logits of the last position only); each timed call decodes ``tokens`` tokens greedily
  from a fresh copy of that cache (the copy is made outside the timed region);
* the calls are interleaved in ``rounds`` rounds, the order rotated each round, as ``headcut bench`` times them
  (:func:`headcut.model.measure.time_rounds`), and the speed-up is the paired one of bench
  (:func:`headcut.stats.paired_speedup`: each round's unpruned time over the cut's);
* a budget reaches the target when the 25th percentile of its paired speed-ups is at least ``X`` (three rounds
  in four at least that fast: a cut within the noise of the target does not count).

The search halves the ladder (the speed-up grows as the budget shrinks): the least cut that reaches ``X`` is the
``--kv-budget`` the prune then runs. Where even the deepest budget tried falls short, the run stops naming the
best speed-up measured. The report's ``speed_target`` has every budget tried with its heads, bytes and speed-ups.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ...adapters.runtime import returned_cache
from ...config import PruneConfig
from ...data import Calibration
from ...devices import available_memory, gib
from ...errors import HeadcutError, label
from ...model.kv_cache import CacheAccount, cache_account, check_context
from ...model.masks import HeadMask
from ...model.measure import SelfTimed, time_rounds
from ...model.surgery import model_blocks, slim
from ...pruning import get_method
from ...pruning.base import batches_of
from ...pruning.costs import allocate, loss_judge, resolve_bytes
from ...pruning.ranked import Ranker
from ...pruning.units import UnitState, block_sets
from ...stats import paired_speedup, percentile

#: the budgets tried, as fractions of the KV-cache bytes kept
LADDER = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
#: prefill chunk (tokens)
CHUNK = 2048


@dataclass
class Tried:
    """One budget timed: ``fraction`` of the KV bytes kept, the heads and bytes its cut keeps, each round's paired
    speed-up and whether it reached the target."""

    fraction: float
    heads: int
    kv_bytes: int
    speedups: list[float]
    reached: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "heads": self.heads,
            "kv_bytes": self.kv_bytes,
            "speedup_median": percentile(self.speedups, 50),
            "speedup_p25": percentile(self.speedups, 25),
            "speedup_p75": percentile(self.speedups, 75),
            "speedups": self.speedups,
            "reached": self.reached,
        }


@dataclass
class SpeedSearch:
    """The report's ``speed_target``: what was asked, where it was timed, every budget tried and the chosen one."""

    target: float
    device: str
    context: int
    tokens: int
    rounds: int
    heads_before: int
    kv_bytes_before: int
    tried: list[Tried] = field(default_factory=list)
    chosen: float | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        chosen = next((t for t in self.tried if t.fraction == self.chosen), None)
        return {
            "target": self.target,
            "device": self.device,
            "context": self.context,
            "tokens": self.tokens,
            "rounds": self.rounds,
            "heads_before": self.heads_before,
            "kv_bytes_before": self.kv_bytes_before,
            "chosen_fraction": self.chosen,
            "reached": None if chosen is None else chosen.to_json(),
            "tried": [t.to_json() for t in self.tried],
            "seconds": self.seconds,
        }


def _cache_keyword(model: nn.Module) -> str:
    """The name the model's forward takes its cache under (``cache`` in newer transformers)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefill(model: nn.Module, context: int, device: torch.device, seed: int) -> tuple[Any, torch.Tensor]:
    """The cache after ``context - 1`` random token ids, and the next token to feed."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache, keyword = None, _cache_keyword(model)
    with torch.inference_mode():
        for start in range(0, context - 1, CHUNK):
            chunk = ids[:, start : min(start + CHUNK, context - 1)]
            out = model(input_ids=chunk, use_cache=True, logits_to_keep=1, **{keyword: cache})
            cache = returned_cache(out)
    return cache, ids[:, -1:]


def timed_decode(
    model: nn.Module, cache: Any, first: torch.Tensor, tokens: int, device: torch.device
) -> Callable[[], Any]:
    """A call that decodes ``tokens`` tokens greedily after ``first`` from a fresh copy of ``cache`` and returns its
    own time (:class:`SelfTimed`, milliseconds; the copy is not timed)."""
    keyword = _cache_keyword(model)

    def call() -> SelfTimed:
        fresh = copy.deepcopy(cache)
        token = first
        with torch.inference_mode():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(tokens):
                out = model(input_ids=token, use_cache=True, logits_to_keep=1, **{keyword: fresh})
                fresh = returned_cache(out)
                token = out.logits[:, -1:].argmax(-1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return SelfTimed((time.perf_counter() - start) * 1000.0)

    return call


def decode_call(model: nn.Module, context: int, tokens: int, device: torch.device, seed: int) -> Callable[[], Any]:
    """:func:`timed_decode` from the cache of a prompt of ``context - 1`` random tokens."""
    cache, first = _prefill(model, context, device, seed)
    return timed_decode(model, cache, first, tokens, device)


def check_speed_target(config: PruneConfig, options: Any, layerwise: bool) -> None:
    """The refusals of ``--target-speedup`` that need no model: a one-shot score-based method, the model in memory."""
    if config.target_speedup is None:
        return
    method = get_method(config.method)
    stepwise = getattr(method, "rescoring", False) or getattr(options, "step", None) or getattr(options, "rounds", None)
    if stepwise:
        raise HeadcutError(
            f"{label('target_speedup')} times the cuts of one scoring: a one-shot score-based method (e.g. gradient, "
            f"fluctuation), not {config.method} with steps"
        )
    if layerwise:
        raise HeadcutError(
            f"{label('target_speedup')} times the cut model: it needs the model in memory (not {label('layerwise')}); "
            f"give {label('kv_budget')} instead"
        )


def memory_needed(model: nn.Module, account: CacheAccount, device: torch.device) -> int:
    """Bytes the timing of :func:`find_speed_budget` holds on ``device`` beyond the model as it is now: the weights
    of one cut copy (and of the model itself where it is not on ``device`` yet), the caches of the unpruned model
    and of a cut with a fresh copy of each (four unpruned caches at most), the prompt's token ids, and one prefill
    chunk's attention scores over the whole context in the model's element size (an eager attention holds every
    query head's of the widest layer at once; the fused ones one head's at most)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    on_device = all(p.device == device for p in model.parameters())
    cache = account.bytes(account.current())
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    heads = max((b.heads for b in account.blocks), default=1) if eager else 1
    context = account.context
    scores = heads * min(CHUNK, context) * context * account.element_bytes
    return weights * (1 if on_device else 2) + 4 * cache + 8 * context + scores


def device_memory(device: torch.device) -> int:
    """Bytes free on ``device``: the GPU's free memory (CUDA), else the machine's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_memory()


def check_speed_memory(model: nn.Module, config: PruneConfig, device: torch.device) -> None:
    """Refuse ``--target-speedup`` at a ``--context`` whose timing would not fit ``device`` (:func:`memory_needed`
    against :func:`device_memory`), before anything of it is allocated; the context is checked against the model's
    positions first (:func:`headcut.model.kv_cache.check_context`)."""
    check_context(model, config.context)
    account = cache_account(model, config.context)
    needed, free = memory_needed(model, account, device), device_memory(device)
    if needed > free:
        raise HeadcutError(
            f"{label('target_speedup')} times decoding at {account.context:,} tokens: that holds about {gib(needed)} "
            f"on {device} (the unpruned and cut models' KV caches of {gib(account.bytes(account.current()))} each, "
            f"copied for every timed call, and a cut copy of the weights), and {gib(free)} is free: give a shorter "
            f"{label('context')} or a device with more memory"
        )


def find_speed_budget(
    model: nn.Module,
    config: PruneConfig,
    options: Any,
    cal: Calibration | None,
    device: torch.device,
    progress: Callable[..., None],
    tokens: int = 16,
    rounds: int = 5,
) -> SpeedSearch:
    """The least cut whose measured decode speed-up at ``config.context`` reaches ``config.target_speedup`` (see the
    module's doc); ``progress(done, **fields)`` reports each step (budgets timed, what runs now)."""
    assert config.target_speedup is not None
    start = time.perf_counter()
    method = get_method(config.method)
    account = cache_account(model, config.context)
    blocks = model_blocks(model)
    sets = block_sets(blocks, config.gqa)
    state = UnitState.full(sets)
    search = SpeedSearch(
        target=config.target_speedup,
        device=str(device),
        context=account.context,
        tokens=tokens,
        rounds=rounds,
        heads_before=state.total(),
        kv_bytes_before=account.bytes(account.current()),
    )
    score_config = method.score_config(config, options)  # type: ignore[attr-defined]
    batches = batches_of(cal) if cal is not None and method.entry.data != "none" else None
    progress(0, now="scoring the heads once")
    # the method's own ranking and the search's refinement measure: the cuts timed are those the prune makes
    ranker = Ranker(method, score_config, batches)  # type: ignore[arg-type]
    importance = ranker.importance(model, HeadMask.full(blocks), None)
    judge = loss_judge(model, cal) if isinstance(cal, Calibration) and config.allocation == "cost" else None
    ladder = []
    refused: HeadcutError | None = None
    for fraction in LADDER:
        try:
            budget = resolve_bytes(sets, replace(config, kv_budget=fraction, target_speedup=None), account)
        except HeadcutError as exc:
            refused = exc
            continue
        ladder.append((fraction, budget))
    if not ladder:
        raise HeadcutError(
            f"{label('target_speedup')}: no KV budget from {LADDER[0]} to {LADDER[-1]} can be met ({refused})"
        )
    progress(0, now=f"prefilling the unpruned model's cache of {account.context:,} tokens")
    base = decode_call(model, account.context, tokens, device, config.seed)
    base(), base()  # warm-up
    low, high = 0, len(ladder) - 1  # fractions ladder[low] (least cut) .. ladder[high] (deepest)
    best: Tried | None = None
    while low <= high:
        mid = (low + high) // 2
        fraction, budget = ladder[mid]
        progress(len(search.tried), now=f"cutting to --kv-budget {fraction:g} and timing it")
        final, _, _ = allocate(
            UnitState.full(sets), importance, budget, config.min_heads_per_block, judge, lambda st: st.mask(blocks)
        )
        mask = final.mask(blocks)
        cut = copy.deepcopy(model)
        slim(cut, mask, gqa=config.gqa)
        call = decode_call(cut, account.context, tokens, device, config.seed)
        call()
        times = time_rounds([base, call], rounds, [device, device])
        ratios = [b / c for b, c in zip(times[0], times[1]) if b > 0 and c > 0]
        pair = paired_speedup(times[0], times[1])
        reached = pair is not None and pair[0] >= config.target_speedup
        tried = Tried(fraction, final.total(), budget.state_bytes(final), ratios, reached)
        search.tried.append(tried)
        progress(
            len(search.tried),
            now=f"--kv-budget {fraction:g} ({tried.heads} heads, {tried.kv_bytes:,} KV bytes) measured "
            f"{percentile(ratios, 50):.3g}x (p25 {percentile(ratios, 25):.3g}x){', reached' if reached else ''}",
        )
        del cut, call
        if reached:
            best = tried
            high = mid - 1  # try a lighter cut
        else:
            low = mid + 1
    search.seconds = time.perf_counter() - start
    if best is None:
        fastest = max(search.tried, key=lambda t: percentile(t.speedups, 25))
        raise HeadcutError(
            f"{label('target_speedup')} {config.target_speedup:g}x was not reached at {account.context:,} tokens on "
            f"{device}: the best measured was {percentile(fastest.speedups, 25):.3g}x (25th percentile of "
            f"{rounds} rounds) at --kv-budget {fastest.fraction:g}; ask for at most that, or give --kv-budget"
        )
    search.chosen = best.fraction
    return search
