"""An example of a Django app extending the runtime (docs/extending.md): a host tool that
exposes a queryset to agents, filtered by the run's user, and a receiver of `run_finished`.
Load it with LOOMCYCLE_EXTRA_APPS=examples.hostapp."""
