"""A migration package with one migration that is never applied: pointing an app at it with
``MIGRATION_MODULES`` gives ``/ready`` a real unapplied migration
(tests/system/test_boundary.py)."""
