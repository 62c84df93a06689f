"""``headcut bench``'s job: :func:`bench` (:mod:`.job`) over the timing (:mod:`.run`), the rows of each runtime
(:mod:`.rows` for PyTorch, :mod:`.onnx_rows` for onnxruntime, :mod:`.vllm_rows` for vLLM, over
``vllm_worker.py``, the script vLLM's own interpreter runs) and the results (:mod:`.results`)."""

from .job import Benchmark, bench
from .results import BenchResult, device_name

__all__ = ["BenchResult", "Benchmark", "bench", "device_name"]
