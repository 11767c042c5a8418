"""Tests of the retrieval app."""
