"""SQLAlchemy store beside Optuna's tables (arrives with the end-to-end study issue)."""
