"""sandbox_launcher package."""
