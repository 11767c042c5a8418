"""Admin screens of the upgrade bridge (jobs in ``jobs``, cutover and cleanup in ``cutover``)."""

from . import cutover, jobs  # noqa: F401
