"""Migration operations shared by the apps' migrations."""

from __future__ import annotations

from django.db import migrations


class VendorRunSQL(migrations.RunSQL):
    """``RunSQL`` that runs only on the named database vendors (``connection.vendor``, e.g.
    ``"mysql"``, which covers MariaDB) and does nothing elsewhere, forwards and backwards.

    Use it for a schema object only one engine needs and the model state must not know, such as
    the unique index over a stored generated column that stands in for a partial unique index on
    MySQL/MariaDB (which have none). Reversible when ``reverse_sql`` is given.
    """

    def __init__(self, vendors: tuple[str, ...], sql, reverse_sql=None, **kwargs):
        super().__init__(sql, reverse_sql, **kwargs)
        self.vendors = tuple(vendors)

    def deconstruct(self):
        name, args, kwargs = super().deconstruct()
        kwargs["vendors"] = self.vendors
        return name, args, kwargs

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor in self.vendors:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor in self.vendors:
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self):
        return f"Raw SQL on {', '.join(self.vendors)} only"
