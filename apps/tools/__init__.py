"""Built-in world tools (network, files, shell) and the trust model around them.

They register with the runs tool registry at `AppConfig.ready()`, like every
other app's tools, so the engine never imports them.
"""
