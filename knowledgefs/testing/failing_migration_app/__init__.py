"""An app whose only migration fails (BC-30): it creates an index that already exists."""
