"""One active and one building index version per space on MySQL/MariaDB too.

SQLite and PostgreSQL enforce ``one_active_index_version`` and ``one_building_index_version`` as
partial unique indexes (0003). MySQL/MariaDB have no partial indexes and Django skips conditional
constraints there, so on those engines only: two stored generated columns holding the space id
while the version is active (resp. building) and NULL otherwise, each under a unique index (NULLs
never collide). The columns are not in the model state: Django never writes them. A later
migration that alters ``state`` or ``space_id`` on MySQL must drop and re-create them.
"""

from django.db import migrations

from knowledgefs.migration_ops import MySQLRunSQL, uuid_column_type


def statements(connection):
    uuid = uuid_column_type(connection)  # the type of space_id: uuid on MariaDB, else char(32)
    forwards = [
        "ALTER TABLE retrieval_indexversion "
        f"ADD COLUMN active_space_id {uuid} "
        "AS (CASE WHEN state = 'active' THEN space_id END) STORED, "
        f"ADD COLUMN building_space_id {uuid} "
        "AS (CASE WHEN state = 'building' THEN space_id END) STORED",
        "CREATE UNIQUE INDEX one_active_index_version_gen "
        "ON retrieval_indexversion (active_space_id)",
        "CREATE UNIQUE INDEX one_building_index_version_gen "
        "ON retrieval_indexversion (building_space_id)",
    ]
    backwards = [
        "DROP INDEX one_building_index_version_gen ON retrieval_indexversion",
        "DROP INDEX one_active_index_version_gen ON retrieval_indexversion",
        "ALTER TABLE retrieval_indexversion "
        "DROP COLUMN building_space_id, DROP COLUMN active_space_id",
    ]
    return forwards, backwards


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0003_index_versions"),
    ]

    operations = [MySQLRunSQL(statements)]
