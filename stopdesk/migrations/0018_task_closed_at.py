"""Task.closed_at: a task is over when its runtime says so or after an idle timeout, not when its
items have all settled (stopdesk.services.closing)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("stopdesk", "0017_settle_sees_registrations"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="closed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("closed_at__isnull", True)), fields=["settled_at"], name="task_open_settled"
            ),
        ),
    ]
