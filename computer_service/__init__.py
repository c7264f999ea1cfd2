"""computer_service package."""
