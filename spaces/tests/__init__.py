"""Tests of the spaces app."""
