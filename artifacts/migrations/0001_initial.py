# ArtifactReplica came from the regions app with its table (regions_artifactreplica, made by regions 0002):
# this migration adds the model to the artifacts app's state only, and moves its content type along, so
# its permissions keep their rows. On an empty database regions 0002 still creates the table.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def _move_content_type(apps, schema_editor, source, target):
    content_types = apps.get_model('contenttypes', 'ContentType').objects.using(schema_editor.connection.alias)
    if not content_types.filter(app_label=target, model='artifactreplica').exists():
        content_types.filter(app_label=source, model='artifactreplica').update(app_label=target)


def forwards(apps, schema_editor):
    _move_content_type(apps, schema_editor, 'regions', 'artifacts')


def backwards(apps, schema_editor):
    _move_content_type(apps, schema_editor, 'artifacts', 'regions')


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('regions', '0007_artifactreplica_moves_to_artifacts'),
        ('registry', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ArtifactReplica',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('state', models.CharField(choices=[('pending', 'Pending'), ('copying', 'Copying'), ('verifying', 'Verifying'), ('ready', 'Ready'), ('failed', 'Failed'), ('forbidden', 'Forbidden by residency')], default='pending', max_length=16)),
                        ('bytes_total', models.PositiveBigIntegerField(default=0)),
                        ('bytes_copied', models.PositiveBigIntegerField(default=0)),
                        ('throughput_mbps', models.FloatField(blank=True, null=True)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('last_error', models.TextField(blank=True)),
                        ('upload_ids', models.JSONField(blank=True, default=dict)),
                        ('lease_until', models.DateTimeField(blank=True, null=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('region', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='replicas', to='regions.region')),
                        ('version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='replicas', to='registry.modelversion')),
                    ],
                    options={
                        'db_table': 'regions_artifactreplica',
                        'ordering': ['version__model__name', 'version__version', 'region__code'],
                        'constraints': [models.UniqueConstraint(fields=('version', 'region'), name='replica_unique_region')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
