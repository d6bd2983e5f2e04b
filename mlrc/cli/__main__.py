"""``python -m mlrc.cli``: the ``mlrc`` command."""

from mlrc.cli import app

if __name__ == "__main__":
    app()
