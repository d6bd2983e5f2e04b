"""Losses, miners and training strategies, one registry each (arrives with the methods issue)."""
