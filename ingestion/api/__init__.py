"""The ingestion REST API: document and job views (:mod:`.views`) and their serializers
(:mod:`.serializers`); the URL patterns are in :mod:`ingestion.urls`."""
