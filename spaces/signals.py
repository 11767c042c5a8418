"""The signals spaces sends so that higher apps act on a space without spaces importing them.

Every signal is sent synchronously with ``sender=KnowledgeSpace`` and ``space=`` the instance,
inside the caller's transaction (if any); a receiver's exception propagates to the sender and
undoes what the transaction did. Receivers are connected in the receiving app's
``AppConfig.ready()`` and run in connection order, that is ``INSTALLED_APPS`` order.
"""

from django.dispatch import Signal

# args: space
# Sent by ``delete_space`` before anything changes: a receiver refuses the deletion by raising a
# coded error (upgrades: ``space_upgrade_in_progress`` while an upgrade into the space runs).
space_deletion_requested = Signal()

# args: space
# Sent by ``delete_space`` once the space is marked ``deleting_at``, outside any transaction,
# and again inside the deletion transaction under the space's row lock (for what was admitted
# meanwhile): receivers remove what the space holds (ingestion purges its documents).
space_emptying = Signal()

# args: space
# Sent by ``delete_space`` inside the deletion transaction after the keys bound only to the space
# are gone, just before the row is deleted: receivers detach the rows that outlive the space
# (upgrades: finished upgrade jobs keep their record with no space).
space_deleting = Signal()

# args: space
# Sent where a space's embedding profile becomes usable for vectors (admission freezes it, a
# preflight records it ``ready``), inside that transaction with the profile row locked:
# receivers make sure the space has its index version (retrieval).
embedding_profile_ready = Signal()
