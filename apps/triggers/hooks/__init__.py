"""Tool-use hooks (SPEC 2.9, 9.3): registrations (services, selectors, api),
the per-process registry every worker reads (cache), and the pre/post chains
that call them around each tool call (chain, callback), installed into the
engine's interceptor seam (apps.core.toolregistry) at AppConfig.ready."""
