"""The console's views: each parses, calls a service or selector, renders."""
