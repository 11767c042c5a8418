"""Admin for upgrade jobs, their documents and file leases."""
