"""Test set-up shapes the test modules share (the run, tool, MCP and observability helpers), so no
test module imports another."""
