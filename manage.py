#!/usr/bin/env python
"""Django's command-line utility (loomcycle_project.cli: the embedded
Postgres and Redis are started or joined first when DATABASE_URL / REDIS_URL
are unset)."""

from loomcycle_project.cli import main

if __name__ == "__main__":
    main()
