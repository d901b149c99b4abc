"""MariaDB/MySQL only: no copies of other indexes among the model's partial ones.

Django's ``mysql`` backend makes a partial index as a full one on the same columns, without its
condition: there ``outbox_msg_pending_idx (id)`` repeats the primary key and
``outbox_msg_key_open_idx (key, id)`` repeats ``outbox_msg_key_idx``. Each was one more entry to write per
``send()`` and served no query the other does not: the claim walks 0009's ``outbox_msg_status_id_idx
(status, id)`` (``FORCE INDEX``), and the head-of-key probe and the admin's search by key read
``(key, id)`` or ``(status, id)``. Both are dropped there.

The other partial indexes keep Django's shapes: status-led ones (``(status, available_at)`` for the due
index, ``(key, status, id)`` for the open keys, ``(status, created_at)`` for the finished rows) served
their queries without walking delivered history, but every claim and every record rewrote an entry in
each, and two worker processes drained 0.76x as fast (docs/performance.md, "## MariaDB"). The lease
index ``(locked_by)`` is as good as partial there: every change away from ``processing`` clears
``locked_by``. Nothing happens on other databases; backwards, the two indexes are made again as Django
made them, so an earlier migration that removes one finds it.

Django's migration state keeps listing the model's indexes as the model declares them (the state is the
same for every database): a later migration that removes or renames ``outbox_msg_pending_idx`` or
``outbox_msg_key_open_idx`` must skip MariaDB/MySQL, where they are not there.
"""

from typing import Any

from django.db import migrations

TABLE = "django_outbox_message"
#: name: Django's shape on MariaDB/MySQL (made again backwards)
COPIES = {
    "outbox_msg_pending_idx": "id",
    "outbox_msg_key_open_idx": "`key`, id",
}


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(f"ALTER TABLE {TABLE} {', '.join(f'DROP INDEX {name}' for name in COPIES)}")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    clauses = ", ".join(f"ADD INDEX {name} ({columns})" for name, columns in COPIES.items())
    schema_editor.execute(f"ALTER TABLE {TABLE} {clauses}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0009_mysql_shapes"),
    ]

    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
