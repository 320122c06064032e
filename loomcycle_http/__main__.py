"""`python -m loomcycle_http`: the command line."""

from loomcycle_http.cli import main

main()
