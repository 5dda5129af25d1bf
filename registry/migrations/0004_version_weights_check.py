# Versions registered before this release are taken as declared: their ingest did not read bytes the home
# store already held, so it proved nothing more than that. New versions start pending (the model's
# default), and registration sets the state it means (registry.services.versions).

from django.db import migrations, models

CHOICES = [
    ('pending', 'Waiting for ingest'),
    ('verified', 'Verified at ingest'),
    ('refused', 'Refused at ingest'),
    ('declared', 'Taken as declared (ingest off)'),
]


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0003_retrieval_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='weights_check',
            field=models.CharField(choices=CHOICES, default='declared', max_length=16),
        ),
        migrations.AlterField(
            model_name='modelversion',
            name='weights_check',
            field=models.CharField(choices=CHOICES, default='pending', max_length=16),
        ),
    ]
