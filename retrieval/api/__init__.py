"""Retrieval's REST views: retrieval tests and golden questions (:mod:`.views`), cited answers
(:mod:`.answers`) and research tasks (:mod:`.research_tasks`); the routes are in
:mod:`retrieval.urls`."""

from .answers import QueryTraceView, QueryView  # noqa: F401
from .research_tasks import (  # noqa: F401
    ResearchTaskDetailView,
    ResearchTaskListView,
    ResearchTaskPartialsView,
    ResearchTaskPlanView,
    ResearchTaskResumeView,
    SpaceResearchTaskListView,
)
from .views import GoldenQuestionDetailView, GoldenQuestionListView, RetrievalTestView  # noqa: F401
