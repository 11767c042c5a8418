"""Loads the shared fixtures (knowledgefs/testing/fixtures.py) for every test directory."""

pytest_plugins = ["knowledgefs.testing.fixtures"]
