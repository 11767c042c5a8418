"""Dataset-upgrade models arrive with the upgrade bridge."""
