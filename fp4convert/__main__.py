"""``python -m fp4convert``: the ``fp4convert`` command (what ``torchrun ... -m fp4convert convert`` runs)."""

from fp4convert.cli import main

main()
