"""The model and its cut: loading (safetensors only, unless allowed), head gates, masks, slimming, the runtime
copied into saved models, the record that reloads them, model facts, layer replay and evaluation."""
