"""``python -m llmslo.cli``: the same as the ``llmslo`` command."""

from llmslo.cli import main

main()
