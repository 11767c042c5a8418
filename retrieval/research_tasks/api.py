"""Re-exports for callers not yet moved."""

from ..api.research_tasks import (  # noqa: F401
    ResearchTaskDetailView,
    ResearchTaskListView,
    ResearchTaskPartialsView,
    ResearchTaskPlanView,
    ResearchTaskResumeView,
    SpaceResearchTaskListView,
)
