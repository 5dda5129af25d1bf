# The ArtifactReplica model moved to the artifacts app (artifacts 0001_initial takes it over in the
# migration state). Its table, regions_artifactreplica, and every row in it stay exactly as they are.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('regions', '0006_deployment_shared'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='ArtifactReplica')],
            database_operations=[],
        ),
    ]
