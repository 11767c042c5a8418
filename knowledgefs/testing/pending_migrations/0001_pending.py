"""Never applied; it changes nothing."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies: list = []
    operations: list = []
