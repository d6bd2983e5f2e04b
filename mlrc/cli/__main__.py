"""``python -m mlrc.cli``: the ``mlrc`` command."""

from mlrc.cli import app

app()
