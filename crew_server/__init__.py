"""crew_server package."""
