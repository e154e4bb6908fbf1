"""``python -m vrl.cli``: the ``vrl`` command (devnet starts its nodes so)."""

from vrl.cli import app

app()
