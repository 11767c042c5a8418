"""The spaces app's HTTP API: the product views (:mod:`.views`), their serializers
(:mod:`.serializers`) and Dify's internal views (:mod:`.internal`); routed by spaces/urls.py."""
