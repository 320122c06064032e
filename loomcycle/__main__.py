"""`python -m loomcycle`: the command line."""

from loomcycle.cli import main

main()
