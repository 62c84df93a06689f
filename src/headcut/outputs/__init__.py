"""What a run writes: output files and folders written atomically (:mod:`.files`), reports, model cards, and
the deployment formats (:mod:`.formats`: ONNX, GGUF)."""
