"""`python -m loomcycle_project <command>`: manage.py for an installed runtime."""

from loomcycle_project.cli import main

main()
