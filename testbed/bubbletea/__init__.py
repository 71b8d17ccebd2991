"""BubbleTea: serve LLM prefill requests inside training pipeline bubbles. Its policy, its simulated half, its role
processes and its emulated half (docs/architecture.md, "BubbleTea, one package across the layers")."""
