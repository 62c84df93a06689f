"""headcut's benchmarks: the page's harness (``harness/``), the studies run on their own (``studies/``), the stored
results (``results/``), the checks the docs cite (``engines.py``, ``gguf_llamacpp.py``, ``onnx_parity.py``), the
README's classifier (``classifier.py``) and the archive of earlier one-off scripts (``archive/``, not maintained).
See ``benchmarks/README.md``."""
