"""Datasources through Dify (docs/datasources.md): sources per space, their items (one logical
document per provider item), durable import and sync runs on the jobs kernel, sync policies."""
