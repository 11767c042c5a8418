"""Documents, compilation jobs, parse artifacts and knowledge nodes (chunks)."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

# Sources (Dify datasources) live in their own module; imported here so Django registers them.
from ingestion.sources.models import Source as Source
from ingestion.sources.models import SourceItem as SourceItem
from ingestion.sources.models import SourceRun as SourceRun
from ingestion.sources.models import SourceRunItem as SourceRunItem
from knowledgefs.db import SpaceScopedQuerySet
from spaces.models import KnowledgeSpace


class DocumentState(models.TextChoices):
    QUEUED = "queued", "Queued"
    PROCESSING = "processing", "Processing"
    PUBLISHED = "published", "Published"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"


class Document(models.Model):
    """One uploaded file in a knowledge space.

    ``filename`` is kept verbatim for display and citations; ``storage_key`` is generated from ids
    and never derives from it. ``sha256`` is unique per space (duplicate uploads are refused or
    replace the existing document). ``active_generation`` names the compilation job whose nodes
    are published; nodes of any other generation are invisible to queries.

    ``enabled`` is the document's availability: retrieval never returns nodes of a disabled
    document. ``row_version`` (starting at 1) moves forward by one on every change of ``enabled``
    or ``metadata``; writers pass the version they read (compare-and-set, see
    :mod:`ingestion.availability`).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="documents")
    filename = models.CharField(max_length=512)
    mime_type = models.CharField(max_length=120)
    size_bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=300, unique=True)
    state = models.CharField(
        max_length=16, choices=DocumentState.choices, default=DocumentState.QUEUED
    )
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    active_generation = models.UUIDField(null=True, blank=True)
    node_count = models.PositiveIntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    row_version = models.PositiveIntegerField(default=1)
    # The published revision (ingestion.revisions): swapped with active_generation at publish.
    active_revision = models.ForeignKey(
        "DocumentRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SpaceScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["space", "sha256"], name="document_sha256_unique_per_space"
            ),
            models.CheckConstraint(
                condition=models.Q(row_version__gte=1), name="document_row_version_positive"
            ),
        ]
        indexes = [
            models.Index(fields=["space", "-created_at"], name="document_space_created"),
            # the knowledge filesystem's listing in filename order (retrieval/fs/listing.py)
            models.Index(fields=["space", "filename", "id"], name="document_space_filename"),
        ]

    def __str__(self) -> str:
        return self.filename


class Stage(models.TextChoices):
    """Checkpoints of a compilation attempt, in order; ``failed`` and ``canceled`` are terminal."""

    QUEUED = "queued", "Queued"
    PARSED = "parsed", "Parsed"
    NODES_GENERATED = "nodes_generated", "Nodes generated"
    PROJECTION_BUILT = "projection_built", "Projection built"
    PUBLISHED = "published", "Published"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"


class RunState(models.TextChoices):
    DISPATCH_PENDING = "dispatch_pending", "Dispatch pending"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    RETRY_WAIT = "retry_wait", "Waiting to retry"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"
    SUPERSEDED = "superseded", "Superseded"


LIVE_RUN_STATES = [
    RunState.DISPATCH_PENDING,
    RunState.QUEUED,
    RunState.RUNNING,
    RunState.RETRY_WAIT,
]


class CompilationJob(models.Model):
    """One durable attempt to compile a document; the database, not the queue, is the truth.

    ``stage`` is the last committed checkpoint; ``run_state`` says whether the attempt is live. At
    most one live attempt exists per document (partial unique index). A dispatch first claims the
    attempt by writing a fresh ``task_id`` (and ``dispatched_at``); a delivery starts only by a
    compare-and-set from ``queued`` with that task id and writes only while it holds
    ``lease_token``; the job id is also the node generation it builds.

    ``progress`` is ``{"phase", "operation", "elements_parsed", "nodes_total", "nodes_embedded",
    "percent"}``. ``retry_of`` links a manual retry to the attempt it continues (the attempt
    history); ``next_attempt_at`` is when a ``retry_wait`` attempt becomes due again.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="jobs")
    # NULL once the document is deleted: the attempts that deletion canceled stay readable as
    # ``canceled`` (``error_code`` ``document_deleted``); its ended attempts go with it.
    document = models.ForeignKey(
        Document, null=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    stage = models.CharField(max_length=20, choices=Stage.choices, default=Stage.QUEUED)
    run_state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.QUEUED)
    task_id = models.CharField(max_length=64, blank=True, default="")
    execution_attempts = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=120, blank=True, default="")
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    # The revision this attempt compiles (its source bytes); every attempt has one once admitted.
    revision = models.ForeignKey(
        "DocumentRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    attempt_number = models.PositiveIntegerField(default=1)
    progress_percent = models.PositiveSmallIntegerField(default=0)
    progress = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    error_retryable = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["document"],
                condition=Q(run_state__in=LIVE_RUN_STATES),
                name="one_live_job_per_document",
            )
        ]
        indexes = [
            models.Index(fields=["run_state", "updated_at"], name="job_run_state_updated"),
            models.Index(fields=["document", "-created_at"], name="job_document_created"),
            # The job list of a space, newest first with the id breaking ties (keyset pages).
            models.Index(fields=["space", "-created_at", "-id"], name="job_space_created"),
            models.Index(fields=["run_state", "lease_expires_at"], name="job_run_state_lease"),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({self.stage}/{self.run_state})"


class ParseArtifact(models.Model):
    """The immutable output of parsing one document in one compilation job.

    ``elements`` is a list of ``{type, text, page_number, section_path, level, metadata}``; the
    canonical text that node offsets point into is rebuilt from it deterministically.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.OneToOneField(CompilationJob, on_delete=models.CASCADE, related_name="artifact")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="artifacts")
    parser = models.CharField(max_length=40)
    artifact_hash = models.CharField(max_length=64)
    page_count = models.PositiveIntegerField(null=True, blank=True)
    pages_without_text = models.JSONField(default=list, blank=True)
    elements = models.JSONField(default=list)
    # Conservative in-memory size of ``elements``
    # (ingestion.retained_bytes.estimate_retained_bytes), charged against the retained-artifact
    # budget before a resumed job loads the artifact.
    retained_bytes = models.PositiveBigIntegerField(default=0)
    # Images the parser rendered or extracted, stored through knowledgefs.storage: a list of
    # {key, kind, name, page_number, mime_type, width, height, bytes, sha256, element_index};
    # the objects live exactly as long as this row (ingestion.compilation).
    assets = models.JSONField(default=list, blank=True)
    # Pages whose text came from OCR, and the parser's client-safe notes (e.g. "page 2: no text
    # layer (OCR unavailable: rasterizer off)").
    ocr_pages = models.JSONField(default=list, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    # What image understanding did for this generation (ingestion.enrichment): ``{"skipped":
    # reason}`` when the reasoning model cannot see images, else ``{"described", "reused",
    # "failed": {asset index: reason}, "skipped_images": {asset index: reason}}``; ``{}`` when
    # the step has not run (or the document holds no images).
    image_understanding = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class KnowledgeNode(models.Model):
    """A retrievable chunk: text with half-open offsets into the canonical text and its place.

    ``generation`` is the id of the compilation job that built it; the node is visible only while
    its document's ``active_generation`` equals it. ``id`` is a UUIDv5 of the generation and the
    chunk index, so re-running a stage rebuilds the same ids.
    """

    id = models.UUIDField(primary_key=True, editable=False)
    space = models.ForeignKey(KnowledgeSpace, on_delete=models.CASCADE, related_name="nodes")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="nodes")
    generation = models.UUIDField()
    chunk_index = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, default="chunk")
    text = models.TextField()
    start_offset = models.PositiveIntegerField()
    end_offset = models.PositiveIntegerField()
    page_number = models.PositiveIntegerField(null=True, blank=True)
    section_path = models.JSONField(default=list, blank=True)
    # What the chunk holds beyond its text (ingestion.chunking.Chunk.metadata): a table piece's
    # rows, header and sheet, a code piece's language.
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["document", "generation", "chunk_index"], name="node_chunk_unique"
            ),
            models.CheckConstraint(
                condition=Q(end_offset__gt=models.F("start_offset")), name="node_not_empty"
            ),
        ]
        indexes = [models.Index(fields=["space", "generation"], name="node_space_generation")]


class VisualProjection(models.Model):
    """One document image embedded by the space's image-capable embedding profile: the visual
    vector space, kept apart from the text projections (a text vector is never scored against
    it). ``generation`` is the job that built it (visible only while its document's
    ``active_generation`` equals it); ``vector_space_id`` is the profile's that embedded it, so a
    query vector of another profile never meets it; ``asset_index`` points into the generation's
    ``ParseArtifact.assets`` (the image, its page, the asset route)."""

    id = models.UUIDField(primary_key=True, editable=False)
    space = models.ForeignKey(
        KnowledgeSpace, on_delete=models.CASCADE, related_name="visual_projections"
    )
    document = models.ForeignKey(
        Document, on_delete=models.CASCADE, related_name="visual_projections"
    )
    generation = models.UUIDField()
    asset_index = models.PositiveIntegerField()
    asset_key = models.CharField(max_length=512)
    page_number = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=32, default="")
    mime_type = models.CharField(max_length=64)
    sha256 = models.CharField(max_length=64)
    vector_space_id = models.CharField(max_length=200)
    dimension = models.PositiveIntegerField()
    vector = models.BinaryField()  # float32, L2-normalised
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["document", "generation", "asset_index", "vector_space_id"],
                name="visual_projection_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["space", "vector_space_id"], name="visual_space_vectors"),
        ]


class UploadStatus(models.TextChoices):
    """States of an upload session (reference spec §4.3): ``creating → ready → completing →
    completed``; ``ready → aborting → aborted``; ``ready → (sweep) expired``; ``failed``."""

    CREATING = "creating", "Creating"
    READY = "ready", "Ready"
    COMPLETING = "completing", "Completing"
    COMPLETED = "completed", "Completed"
    ABORTING = "aborting", "Aborting"
    ABORTED = "aborted", "Aborted"
    EXPIRED = "expired", "Expired"
    FAILED = "failed", "Failed"


UPLOAD_TERMINAL = [
    UploadStatus.COMPLETED,
    UploadStatus.ABORTED,
    UploadStatus.EXPIRED,
    UploadStatus.FAILED,
]


class UploadSession(models.Model):
    """One upload session (ingestion.upload_sessions): a declared file whose bytes arrive later.

    ``object_key`` is where the bytes are written (the key the document will keep, built from
    the session id, which becomes the document id). ``reserved_bytes`` is the space's quota
    reservation (the declared size), zeroed at every terminal state. ``idempotency_key`` makes a
    create replayable per space. ``target_document_id`` names the document a replacement
    session replaces. Status changes are compare-and-set on ``row_version``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant_id = models.CharField(max_length=64)
    space = models.ForeignKey(
        KnowledgeSpace, on_delete=models.CASCADE, related_name="upload_sessions"
    )
    status = models.CharField(
        max_length=16, choices=UploadStatus.choices, default=UploadStatus.CREATING
    )
    mode = models.CharField(max_length=20, default="small_fallback")
    file_name = models.CharField(max_length=512)
    content_type = models.CharField(max_length=255, blank=True, default="")
    expected_size_bytes = models.PositiveBigIntegerField()
    checksum_sha256 = models.CharField(max_length=44)
    # NULL without a key: a plain unique constraint then holds on every engine (NULLs differ).
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    on_duplicate = models.CharField(max_length=10, default="reject")
    target_document_id = models.UUIDField(null=True, blank=True)
    object_key = models.CharField(max_length=300, unique=True)
    reserved_bytes = models.PositiveBigIntegerField(default=0)
    document_id = models.UUIDField(null=True, blank=True)
    job_id = models.UUIDField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    row_version = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SpaceScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["space", "idempotency_key"], name="upload_session_idempotency_per_space"
            )
        ]
        indexes = [models.Index(fields=["status", "expires_at"], name="upload_status_expires")]


class DocumentRevision(models.Model):
    """One version of a document's source (ingestion.revisions): its bytes, name and type.

    Every admission creates one (number 1 for a new document, then 2, 3, … for replacements).
    A replacement's revision is a *candidate* while its job compiles; publishing its job swaps
    it in (the document's ``active_revision`` and ``active_generation`` in one transaction) and
    the previous one becomes *superseded*. Its public state is derived
    (:func:`ingestion.revisions.state_of`), never stored, so no failure path has to keep it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    job = models.ForeignKey(
        CompilationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    filename = models.CharField(max_length=512)
    mime_type = models.CharField(max_length=120)
    size_bytes = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["document", "number"], name="revision_number_unique")
        ]
