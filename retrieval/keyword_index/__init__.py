"""The SQLite keyword leg's per-space tantivy indexes: :mod:`.analysis` (schema, analyzer,
queries), :mod:`.store` (directories, opening, writer lock, reloads, the swap) and
:mod:`.maintenance` (verification, rebuilds from the database, healing)."""
