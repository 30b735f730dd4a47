"""``python -m fp4convert.cli``: the same as the ``fp4convert`` command."""

from fp4convert.cli import main

main()
