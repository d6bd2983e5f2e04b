"""Trunks, frozen BatchNorm, embedder (the trainable models arrive with the study issue)."""
