"""Tests of the ingestion app."""
