"""The signals spaces sends so that higher apps act on a space without spaces importing them.

Every signal is sent synchronously with ``sender=KnowledgeSpace`` and ``space=`` the instance,
inside the sender's transaction when it holds one; a receiver's exception propagates to the
sender (and undoes what that transaction did). Receivers are connected in the receiving app's
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
# Sent where a space's embedding profile is usable for vectors: by admission once the profile is
# frozen and ready (after the latch committed), and by a preflight that records a frozen profile
# ``ready`` (inside its transaction, the space's and the profile's rows locked). Receivers make
# sure the space has its active index version (retrieval).
embedding_profile_ready = Signal()
