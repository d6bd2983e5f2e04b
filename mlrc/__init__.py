"""mlrc: hyperparameter search for deep metric learning under the metric-learning reality check."""

__version__ = "0.1.0"
