"""Cross-app tests (system/) and the committed test data (fixtures/)."""
