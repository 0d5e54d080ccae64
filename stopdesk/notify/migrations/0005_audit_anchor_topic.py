from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notify", "0004_stop_requested_topic"),
    ]

    operations = [
        migrations.AlterField(
            model_name="notification",
            name="topic",
            field=models.CharField(
                choices=[
                    ("item_uncertain", "An item became uncertain"),
                    ("investigate_near", "An investigate-by deadline is near"),
                    ("investigate_passed", "An investigate-by deadline passed"),
                    ("late_result", "A late result contradicts a recorded outcome"),
                    ("compensation_proposed", "A compensation waits for approval"),
                    ("compensation_escalated", "A compensation was escalated"),
                    ("compensation_failed", "A compensation failed"),
                    ("stop_unsettled", "A stop has not settled in time"),
                    ("stop_requested", "Stop was pressed (the task, its runtime and the tools in flight)"),
                    ("task_digest", "A digest of one task's item alerts"),
                    ("audit_anchor", "The audit chain's heads, signed (for a receiver that keeps them)"),
                ],
                max_length=40,
            ),
        ),
        migrations.AlterField(
            model_name="webhookendpoint",
            name="topics",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="Topics to send; empty means all but stop_requested and audit_anchor, which are sent only if named.",
            ),
        ),
    ]
