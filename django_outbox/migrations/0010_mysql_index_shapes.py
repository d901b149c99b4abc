"""MariaDB/MySQL only: the model's partial indexes in shapes that serve their queries there.

Django's ``mysql`` backend makes a partial index as a full one on the same columns, without its
condition: ``outbox_msg_pending_idx (id)`` repeated the primary key, ``outbox_msg_key_open_idx (key, id)``
repeated ``outbox_msg_key_idx``, and the due, open-key and finished indexes walked every row of the table
(delivered history included) where their queries want the few rows of one status. Here each keeps its name
and is led by the status its queries ask for (a B-tree on ``status`` first serves ``status = ...`` and
``status IN (...)`` as ranges):

- ``outbox_msg_due_idx (status, available_at)``: the idle worker's next due time and the lag's walk of
  the due messages oldest first (the overview, ``outbox_status``, metrics, health);
- ``outbox_msg_key_open_idx (key, status, id)``: the claim's "is an earlier message of this key open?",
  the lag's held-by-key probe, the blocked keys' waiting messages, the key-lock prune; ``key`` first, so
  the admin's search by key keeps ``outbox_msg_key_idx (key, id)``, newest first;
- ``outbox_msg_finished_idx (status, created_at)``: housekeeping's batches of finished rows, oldest
  first within each status (``ORDER BY status, created_at`` there, an order this index gives: no sort,
  and the walk passes over no open row);
- ``outbox_msg_pending_idx`` is dropped: the claim walks 0009's ``outbox_msg_status_id_idx (status, id)``.

``outbox_msg_lease_idx (locked_by)`` stays as Django made it: every status change away from
``processing`` clears ``locked_by``, so its only non-NULL entries are the rows in flight, which is the
partial index's content. Nothing happens on other databases; backwards, the indexes get Django's shapes
again, so an earlier migration that removes one of them finds it.

Django's migration state keeps listing the model's indexes as the model declares them (the state is
the same for every database). A later migration that removes or renames ``outbox_msg_pending_idx``
must skip MariaDB/MySQL, where it is not there.
"""

from typing import Any

from django.db import migrations

TABLE = "django_outbox_message"
#: name: (MariaDB/MySQL shape, or None for dropped; Django's shape, as 0009 leaves it)
SHAPES: dict[str, tuple[str | None, str]] = {
    "outbox_msg_pending_idx": (None, "id"),
    "outbox_msg_due_idx": ("status, available_at", "available_at"),
    "outbox_msg_key_open_idx": ("`key`, status, id", "`key`, id"),
    "outbox_msg_finished_idx": ("status, created_at", "created_at"),
}


def _reshape(schema_editor: Any, *, forwards: bool) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    clauses = []
    for name, (ours, djangos) in SHAPES.items():
        old, new = (djangos, ours) if forwards else (ours, djangos)
        if old is not None:
            clauses.append(f"DROP INDEX {name}")
        if new is not None:
            clauses.append(f"ADD INDEX {name} ({new})")
    # One statement: the table is read once for all the new indexes, and no moment has neither shape.
    schema_editor.execute(f"ALTER TABLE {TABLE} {', '.join(clauses)}")


def forwards(apps: Any, schema_editor: Any) -> None:
    _reshape(schema_editor, forwards=True)


def backwards(apps: Any, schema_editor: Any) -> None:
    _reshape(schema_editor, forwards=False)


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0009_mysql_shapes"),
    ]

    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
