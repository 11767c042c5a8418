"""Admin for cutover ledgers and cleanup authorizations."""
