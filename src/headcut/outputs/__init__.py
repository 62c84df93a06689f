"""What a run writes above the safe-writing layer (:mod:`headcut.files`): reports, model cards, and the deployment
formats (:mod:`.formats`: ONNX, GGUF)."""
