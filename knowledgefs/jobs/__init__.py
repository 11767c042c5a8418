"""The durable-job kernel: the claim-before-enqueue queue (:mod:`.claims`) and the django-q2
schedule registry (:mod:`.schedules`). Imports no app; the apps configure and register."""
