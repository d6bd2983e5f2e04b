"""The fold trainer (arrives with the end-to-end study issue). Knows nothing of Optuna."""
