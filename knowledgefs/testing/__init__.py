"""Test support shared by every test directory: fixtures, contract servers, factories.

Imported by tests only (the root conftest.py loads ``knowledgefs.testing.fixtures``);
no product module imports it."""
