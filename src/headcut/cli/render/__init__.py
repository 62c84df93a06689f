"""The tables and lines the commands show (rich renderables built from the API's results and reports), one
module per command (:mod:`.info`, :mod:`.evaluation`, :mod:`.score` with its plot, :mod:`.prune`, :mod:`.finetune`,
:mod:`.bench`) and what prune, finetune and export share (:mod:`.checkpoint`: how the written checkpoint loads,
where it serves, its ONNX and GGUF files)."""
