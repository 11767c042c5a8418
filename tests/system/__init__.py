"""Cross-app and process-level tests: clusters, servers, browsers, migrations, deployment."""
