"""BubbleTea: serve LLM prefill requests inside training pipeline bubbles (used by sim and runtime)."""
