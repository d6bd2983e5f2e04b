"""Losses, miners, batch samplers and training strategies: one registry each, one layout (`base.py`, one module per method, `spaces/`)."""
