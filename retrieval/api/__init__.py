"""Retrieval's REST views: retrieval tests and golden questions (:mod:`.views`), cited answers
(:mod:`.answers`) and research tasks (:mod:`.research_tasks`); the routes are in
:mod:`retrieval.urls`."""
