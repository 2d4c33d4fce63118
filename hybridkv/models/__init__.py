"""Model checkpoints for the engine: GGUF conversion and the offline Gemma 3 270M demo."""
