"""Tests of the upgrades app."""
