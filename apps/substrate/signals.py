"""Signals other apps listen to (substrate imports none of them).

`version_activated`: a version became the active, unretired one of its
(tenant, name): promoted (create/fork with promote, `promote`) or un-retired
while active. Sent inside the activating transaction, so a receiver's writes
commit or roll back with it. Arguments: `sender` = the kind's key
("schedule", ...), `def_id`, `previous_def_id` (the version active before;
equal to `def_id` for an un-retire or a re-promote of the active one, None if
none was), `at` (the activation time, the pointer's promoted_at).
"""

from __future__ import annotations

from django.dispatch import Signal

version_activated = Signal()
