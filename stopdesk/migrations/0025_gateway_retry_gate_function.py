"""The MCP gateway's retry gate as two volatile functions (stopdesk.gateway.retry_gate), so a call's
gate and its registration with the boundary are one statement, one round trip, and commit as one.

- `stopdesk_retry_gate_earlier(task, upstream, tool, hash)`: the first identical call of the task
  that holds or refuses a new one (in flight and not read-only, not known yet, or found to have
  taken effect), or NULL. Two parts in one query, so one snapshot: the identical calls at work or
  not known yet, by their partial index (`item_gateway_retry_held`; the states are written out,
  so the planner sees the index's own condition), and the completed ones among the task's items
  that were ever unsettled, by the events' partial index (`event_task_unsettled`), each looked up
  by its id (a lateral join kept apart by OFFSET 0, so the planner cannot start from the session's
  completed calls instead, as it did while the statistics were a fresh table's).
- `stopdesk_retry_gate(lock_key, task, upstream, tool, hash)`: identical calls pass one at a time.
  It takes the transaction-level advisory lock `lock_key` (computed by the caller), then reads the
  above; as a volatile function's statement, the read takes its snapshot after the wait, so it
  sees every identical call registered before (the statement's own snapshot would not).

PostgreSQL only: SQLite serialises writers at BEGIN, and the gate reads through the ORM there."""

from django.db import migrations

EARLIER_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_retry_gate_earlier(p_task bigint, p_upstream text, p_tool text, p_hash text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (
        SELECT c.id FROM (
            SELECT w.id, w.state, COALESCE((w.detail #> '{mcp,annotations,readOnlyHint}') = 'true'::jsonb, false) AS read_only
            FROM stopdesk_workitem w
            WHERE w.task_id = p_task AND w.mechanism = 'mcp' AND (w.detail #>> '{gateway,arguments_sha256}') = p_hash
              AND w.state IN ('queued', 'running', 'uncertain', 'awaiting_reconciliation')
              AND (w.detail #>> '{gateway,upstream}') = p_upstream AND (w.detail #>> '{gateway,tool}') = p_tool
            UNION ALL
            SELECT w.id, w.state, false
            FROM (SELECT DISTINCT e.item_id FROM stopdesk_event e
                  WHERE e.task_id = p_task AND e.to_state IN ('uncertain', 'awaiting_reconciliation')
                    AND e.item_id IS NOT NULL) AS u,
                 LATERAL (SELECT * FROM stopdesk_workitem WHERE id = u.item_id OFFSET 0) AS w
            WHERE w.state = 'completed' AND w.mechanism = 'mcp'
              AND (w.detail #>> '{gateway,arguments_sha256}') = p_hash
              AND (w.detail #>> '{gateway,upstream}') = p_upstream AND (w.detail #>> '{gateway,tool}') = p_tool
        ) AS c
        -- a read running beside its twin does no harm
        WHERE NOT (c.state IN ('queued', 'running') AND c.read_only)
        ORDER BY c.id
        LIMIT 1
    );
END;
$$
"""

GATE_FUNCTION = """
CREATE OR REPLACE FUNCTION stopdesk_retry_gate(lock_key bigint, p_task bigint, p_upstream text, p_tool text, p_hash text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    RETURN stopdesk_retry_gate_earlier(p_task, p_upstream, p_tool, p_hash);
END;
$$
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(EARLIER_FUNCTION)
            cursor.execute(GATE_FUNCTION)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION IF EXISTS stopdesk_retry_gate(bigint, bigint, text, text, text)")
            cursor.execute("DROP FUNCTION IF EXISTS stopdesk_retry_gate_earlier(bigint, text, text, text)")


class Migration(migrations.Migration):
    dependencies = [
        ("stopdesk", "0024_gateway_retry_gate_held"),
    ]

    operations = [migrations.RunPython(forward, backward)]
