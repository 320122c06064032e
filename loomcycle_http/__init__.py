"""loomcycle: the Python client (`loomcycle_http.client`) and the `loomcycle` command line
for a loomcycle runtime, over its HTTP API only.

This package imports nothing of the runtime (apps, workers, loomcycle_project, Django):
an import-linter contract keeps it so, and `loomcycle_http/pyproject.toml` installs it alone.
"""

__version__ = "0.1.0"
