"""API-key bindings, step 2 of 3 (data): the old many-to-many becomes binding rows.

Forward: each space of a *scoped* key (in the key's own tenant) becomes a
``knowledge_fs_space`` binding. A scoped key left with no space reached nothing; with no
binding it would now reach the whole tenant, so it is revoked instead (never widened). An
unscoped key's many-to-many rows granted nothing and are not copied: it stays unrestricted.

Backward: ``knowledge_fs_space`` bindings become many-to-many rows again and ``scoped`` is set on
every key that has any binding, so a key bound only to Dify datasets goes back to a scoped key
with no space (reaches nothing). Keys revoked going forward stay revoked. Then the space bindings
of every key that also has a dataset binding are deleted (their space scope lives in the
many-to-many again; the dataset binding stays). Guarded (``knowledgefs.downgrades``): refused
while a live key is bound only to spaces, since removing its space bindings would leave it with
none, i.e. unrestricted; revoked such keys keep their rows (never zero bindings). Forward again,
copying skips bindings that are still there.
"""

from django.db import migrations
from django.utils import timezone

from knowledgefs.migration_ops import GuardedReversal

SPACE = "knowledge_fs_space"
BATCH = 1000


def space_memberships_to_bindings(apps, schema_editor):
    db = schema_editor.connection.alias
    ApiKey = apps.get_model("spaces", "ApiKey")
    ApiKeyBinding = apps.get_model("spaces", "ApiKeyBinding")
    Membership = ApiKey.spaces.through
    rows = (
        Membership.objects.using(db)
        .filter(apikey__scoped=True)
        .values_list("apikey_id", "knowledgespace_id", "apikey__tenant_id", "knowledgespace__tenant_id")
        .order_by("apikey_id", "knowledgespace_id")
    )
    batch = []
    for key_id, space_id, key_tenant, space_tenant in rows.iterator(chunk_size=BATCH):
        if key_tenant != space_tenant:
            continue  # never reachable: the tenant is checked on every request
        batch.append(ApiKeyBinding(api_key_id=key_id, resource_type=SPACE, space_id=space_id))
        if len(batch) >= BATCH:
            ApiKeyBinding.objects.using(db).bulk_create(batch, ignore_conflicts=True)
            batch = []
    if batch:
        ApiKeyBinding.objects.using(db).bulk_create(batch, ignore_conflicts=True)
    (
        ApiKey.objects.using(db)
        .filter(scoped=True, revoked_at__isnull=True)
        .exclude(id__in=ApiKeyBinding.objects.using(db).values("api_key_id"))
        .update(revoked_at=timezone.now())
    )


def bindings_to_space_memberships(apps, schema_editor):
    db = schema_editor.connection.alias
    ApiKey = apps.get_model("spaces", "ApiKey")
    ApiKeyBinding = apps.get_model("spaces", "ApiKeyBinding")
    Membership = ApiKey.spaces.through
    rows = (
        ApiKeyBinding.objects.using(db)
        .filter(resource_type=SPACE)
        .values_list("api_key_id", "space_id")
        .order_by("api_key_id", "space_id")
    )
    batch = []
    for key_id, space_id in rows.iterator(chunk_size=BATCH):
        batch.append(Membership(apikey_id=key_id, knowledgespace_id=space_id))
        if len(batch) >= BATCH:
            Membership.objects.using(db).bulk_create(batch, ignore_conflicts=True)
            batch = []
    if batch:
        Membership.objects.using(db).bulk_create(batch, ignore_conflicts=True)
    bound = ApiKeyBinding.objects.using(db).values("api_key_id")
    ApiKey.objects.using(db).filter(id__in=bound).update(scoped=True)
    # Ids first: MySQL/MariaDB cannot delete from a table with a subquery on the same table.
    keeps_another = sorted(
        set(
            ApiKeyBinding.objects.using(db)
            .exclude(resource_type=SPACE)
            .values_list("api_key_id", flat=True)
        )
    )
    for start in range(0, len(keeps_another), BATCH):
        ApiKeyBinding.objects.using(db).filter(
            resource_type=SPACE, api_key_id__in=keeps_another[start : start + BATCH]
        ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("spaces", "0002_api_key_bindings"),
    ]

    operations = [
        migrations.RunPython(space_memberships_to_bindings, bindings_to_space_memberships),
        # Last, so that it runs first backwards: refuses while a live key is bound only to spaces
        # (and always under `sqlmigrate --backwards`).
        GuardedReversal(guard="spaces.0003_bindings_from_scoped_keys"),
    ]
