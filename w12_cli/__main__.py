"""``python -m w12_cli ...``: the ``w12`` command."""

from w12_cli.main import main

main(prog_name="w12")
