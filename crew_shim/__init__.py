"""crew_shim package."""
