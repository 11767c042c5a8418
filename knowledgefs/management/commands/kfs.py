"""``python manage.py kfs …``: the operator's command line. Each subcommand calls a service."""

from __future__ import annotations

import json
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from tqdm import tqdm

from ingestion import documents, reports
from ingestion.api.serializers import JobSerializer
from ingestion.models import Document, DocumentState
from ingestion.services import compilation
from knowledgefs import downgrades
from knowledgefs.errors import Conflict, ServiceError
from knowledgefs.uploads import upload_limit_message
from retrieval import answer_cli, evaluation, golden, indexing
from retrieval.services import LEGS, PROFILE, retrieve
from spaces import profiles
from spaces import services as spaces
from spaces.models import KnowledgeSpace
from upgrades import cli as upgrade_cli
from upgrades import cutover_cli


class Command(BaseCommand):
    help = (
        "KnowledgeFS operator commands: spaces, API keys, ingest, query, documents, jobs, "
        "stats, retry, cancel, schedules, sweep, eval, downgrade-check, cutover, upgrade."
    )

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

        space = sub.add_parser("space", help="manage knowledge spaces")
        space_sub = space.add_subparsers(dest="action", required=True)
        create = space_sub.add_parser("create", help="create a knowledge space")
        create.add_argument("name")
        create.add_argument("--tenant", required=True)
        create.add_argument("--slug")
        create.add_argument("--description", default="")
        create.add_argument(
            "--exists-ok",
            action="store_true",
            help="succeed if a space with this slug already exists",
        )
        create.add_argument("--json", action="store_true")
        set_model = space_sub.add_parser(
            "set-model", help="change a space's embedding model (builds a new index beside)"
        )
        set_model.add_argument("slug")
        set_model.add_argument("model_id")
        set_model.add_argument("--tenant", required=True)
        set_model.add_argument(
            "--wait", action="store_true", help="build and cut over in this process"
        )
        set_model.add_argument("--json", action="store_true")
        set_embedding = space_sub.add_parser(
            "set-embedding-profile",
            help="choose a space's embedding model (before its first document)",
        )
        set_embedding.add_argument("slug")
        set_embedding.add_argument("--tenant", required=True)
        set_embedding.add_argument("--plugin-id", required=True, help="langgenius/openai, or local")
        set_embedding.add_argument("--provider", required=True, help="openai, or local")
        set_embedding.add_argument("--model", required=True)
        set_embedding.add_argument("--revision", type=int, help="compare-and-set on this revision")
        set_embedding.add_argument("--json", action="store_true")
        set_retrieval = space_sub.add_parser(
            "set-retrieval-profile",
            help="replace a space's retrieval profile (members left out take their defaults)",
        )
        set_retrieval.add_argument("slug")
        set_retrieval.add_argument("--tenant", required=True)
        set_retrieval.add_argument("--mode", dest="default_mode", default="fast")
        set_retrieval.add_argument("--top-k", type=int, default=10)
        set_retrieval.add_argument(
            "--score-threshold", type=float, help="0..1 (needs --rerank-model); off when absent"
        )
        set_retrieval.add_argument(
            "--rerank-model", nargs=3, metavar=("PLUGIN_ID", "PROVIDER", "MODEL")
        )
        set_retrieval.add_argument(
            "--reasoning-model", nargs=3, metavar=("PLUGIN_ID", "PROVIDER", "MODEL")
        )
        set_retrieval.add_argument("--revision", type=int, help="compare-and-set on this revision")
        set_retrieval.add_argument("--json", action="store_true")
        validate = space_sub.add_parser(
            "validate", help="run a space's profile validation (catalog, credentials, real calls)"
        )
        validate.add_argument("slug")
        validate.add_argument("--tenant", required=True)
        validate.add_argument("--json", action="store_true")
        listing = space_sub.add_parser("list", help="list a tenant's knowledge spaces")
        listing.add_argument("--tenant", required=True)
        listing.add_argument("--json", action="store_true")

        apikey = sub.add_parser("apikey", help="manage API keys")
        apikey_sub = apikey.add_subparsers(dest="action", required=True)
        key_create = apikey_sub.add_parser("create", help="create a key (the secret is shown once)")
        key_create.add_argument("--tenant", required=True)
        key_create.add_argument(
            "--space",
            action="append",
            default=[],
            metavar="SLUG",
            help="bind the key to this space (repeatable); none = whole tenant",
        )
        key_create.add_argument(
            "--dataset",
            action="append",
            default=[],
            metavar="DATASET_ID",
            help="bind the key to this Dify dataset (repeatable; reaches no space here)",
        )
        key_create.add_argument("--name", default="")
        key_create.add_argument("--json", action="store_true")
        revoke = apikey_sub.add_parser("revoke", help="revoke a key by secret or prefix")
        revoke.add_argument("key", metavar="KEY_OR_PREFIX")
        revoke.add_argument("--json", action="store_true")
        key_list = apikey_sub.add_parser("list", help="list a tenant's keys (never secrets)")
        key_list.add_argument("--tenant", required=True)
        key_list.add_argument("--json", action="store_true")

        ingest = sub.add_parser("ingest", help="upload files or folders into a space")
        ingest.add_argument("paths", nargs="+", metavar="PATH")
        ingest.add_argument("--space", required=True, metavar="SLUG")
        ingest.add_argument("--tenant", required=True)
        ingest.add_argument(
            "--wait",
            action="store_true",
            help="compile in this process until done; exit 1 if any failed",
        )
        ingest.add_argument(
            "--follow",
            action="store_true",
            help="leave compilation to the worker cluster and show its progress until done",
        )
        ingest.add_argument("--on-duplicate", choices=["skip", "reject", "replace"], default="skip")
        ingest.add_argument("--json", action="store_true")

        query = sub.add_parser("query", help="retrieve cited chunks")
        query.add_argument("text")
        query.add_argument("--space", required=True, metavar="SLUG")
        query.add_argument("--tenant", required=True)
        query.add_argument(
            "--mode", default=None, help="fast, deep, research or auto (default: the profile's)"
        )
        query.add_argument("--top-k", type=int, default=5)
        query.add_argument(
            "--threshold",
            type=answer_cli.threshold_value,
            default=PROFILE,
            metavar="N|off",
            help=answer_cli.THRESHOLD_HELP,
        )
        query.add_argument("--filters", metavar="JSON", help=answer_cli.FILTERS_HELP)
        query.add_argument("--json", action="store_true")

        rt = sub.add_parser(
            "research-tasks", help="list a tenant's research tasks (every owner), newest first"
        )
        rt.add_argument("--tenant", required=True)
        rt.add_argument("--space", metavar="SLUG", help="only this space's tasks")
        rt.add_argument(
            "--status", choices=["queued", "running", "completed", "failed", "canceled"]
        )
        rt.add_argument("--limit", type=int, default=50, help="at most this many (1-1000)")
        rt.add_argument("--json", action="store_true")

        docs = sub.add_parser("documents", help="list a space's documents")
        docs.add_argument("--space", required=True, metavar="SLUG")
        docs.add_argument("--tenant", required=True)
        docs.add_argument("--json", action="store_true")

        jobs = sub.add_parser("jobs", help="list a space's compilation jobs with progress")
        jobs.add_argument("--space", required=True, metavar="SLUG")
        jobs.add_argument("--tenant", required=True)
        jobs.add_argument("--state", help="published, failed, canceled, retry_wait, or a stage")
        jobs.add_argument("--limit", type=int, default=100)
        jobs.add_argument("--json", action="store_true")

        stats = sub.add_parser("stats", help="document, node and job counts of a space")
        stats.add_argument("--space", required=True, metavar="SLUG")
        stats.add_argument("--tenant", required=True)
        stats.add_argument("--json", action="store_true")

        retry = sub.add_parser("retry", help="retry a failed or canceled job")
        retry.add_argument("job_id", metavar="JOB_ID")
        retry.add_argument(
            "--from-start", action="store_true", help="parse again instead of resuming"
        )
        retry.add_argument("--json", action="store_true")

        cancel = sub.add_parser("cancel", help="cancel a queued or running job")
        cancel.add_argument("job_id", metavar="JOB_ID")
        cancel.add_argument("--json", action="store_true")

        sched = sub.add_parser(
            "schedules", help="create or repair the recovery sweep schedule, then show it"
        )
        sched.add_argument("--json", action="store_true")

        sweep = sub.add_parser("sweep", help="run one recovery sweep now")
        sweep.add_argument("--json", action="store_true")

        check = sub.add_parser(
            "downgrade-check",
            help="print the plan of `migrate APP MIGRATION` and every downgrade refusal; "
            "changes nothing (exit 0 allowed, 3 refused)",
        )
        check.add_argument("app_label", metavar="APP")
        check.add_argument("migration", metavar="MIGRATION", help="a name, a unique prefix or zero")
        check.add_argument("--database", default="default")
        check.add_argument("--json", action="store_true")
        cutover_cli.add_parser(sub)
        upgrade_cli.add_parser(sub)
        answer_cli.add_parser(sub)

        ev = sub.add_parser(
            "eval",
            help="evaluate retrieval on a BEIR-format dataset or a space's golden questions",
        )
        ev.add_argument("dataset_dir", metavar="DATASET_DIR", nargs="?")
        ev.add_argument("--split", default="test")
        ev.add_argument("--mode", default="fast", help="a mode, or several: fast,deep,research")
        ev.add_argument("--top-k", type=int, help="items per query (BEIR: 100, golden: 10)")
        ev.add_argument("--legs", choices=["hybrid", "keyword", "dense"], default="hybrid")
        ev.add_argument("--fusion", choices=["minmax", "rrf"], default="minmax")
        ev.add_argument("--fresh", action="store_true", help="rebuild the evaluation space")
        ev.add_argument("--golden", action="store_true", help="run --space's golden questions")
        ev.add_argument("--space", help="golden: the space's slug")
        ev.add_argument("--tenant", help="golden: the space's tenant")
        ev.add_argument("--tag", action="append", help="golden: only questions with this tag")
        ev.add_argument("--baseline", help="regression gate: compare with this baseline JSON")
        ev.add_argument(
            "--max-drop", type=float, default=None, help="gate: allowed drop (0.01; --baseline)"
        )
        ev.add_argument("--write-baseline", help="record (or extend) a baseline JSON")
        ev.add_argument("--json", action="store_true")

    def handle(self, *args, **options) -> None:
        handler = {
            "space": self.space,
            "apikey": self.apikey,
            "ingest": self.ingest,
            "query": self.query,
            "documents": self.documents,
            "research-tasks": self.research_tasks,
            "jobs": self.jobs,
            "stats": self.stats,
            "retry": self.retry,
            "cancel": self.cancel,
            "schedules": self.schedules,
            "sweep": self.sweep,
            "eval": self.eval,
            "downgrade-check": self.downgrade_check,
            "cutover": self.cutover,
            "upgrade": lambda opts: upgrade_cli.handle(self, opts),
            "answer": lambda opts: answer_cli.handle(self, opts),
        }[options["command"]]
        try:
            handler(options)
        except ServiceError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc

    # --- helpers ----------------------------------------------------------------------------
    def emit(self, options: dict, payload, text: str) -> None:
        self.stdout.write(
            json.dumps(payload, ensure_ascii=False, indent=2) if options.get("json") else text
        )

    def _space(self, options: dict) -> KnowledgeSpace:
        principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
        return spaces.get_space_by_slug(principal, options["space"])

    # --- subcommands ------------------------------------------------------------------------
    def space(self, options: dict) -> None:
        principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
        if options["action"] == "set-model":
            space = spaces.get_space_by_slug(principal, options["slug"])
            version = indexing.change_embedding_model(space, options["model_id"])
            if options["wait"] and version.state == "building":
                indexing.rebuild_index_version(version.id)
            summary = indexing.index_summary([v for v in indexing.live_versions(space.id) if v])
            self.emit(
                options,
                summary,
                f"active: {summary['active']}\nbuilding: {summary['building']}",
            )
            return
        if options["action"] in ("set-embedding-profile", "set-retrieval-profile", "validate"):
            self._profiles(principal, options)
            return
        if options["action"] == "create":
            existing = None
            if options["exists_ok"] and options["slug"]:
                existing = spaces.spaces_for(principal).filter(slug=options["slug"]).first()
            space = existing or spaces.create_space(
                principal,
                name=options["name"],
                slug=options["slug"],
                description=options["description"],
            )
            payload = {
                "id": str(space.id),
                "tenant_id": space.tenant_id,
                "name": space.name,
                "slug": space.slug,
            }
            verb = "using existing" if existing else "created"
            self.emit(options, payload, f"{verb} space {space.slug} ({space.id})")
        else:
            rows = [
                {"id": str(s.id), "name": s.name, "slug": s.slug, "readiness": s.profile.state}
                for s in spaces.spaces_for(principal).select_related("profile")
            ]
            self.emit(
                options,
                {"items": rows},
                "\n".join(f"{r['slug']}\t{r['id']}\t{r['readiness']}\t{r['name']}" for r in rows)
                or "no spaces",
            )

    def _profiles(self, principal, options: dict) -> None:
        """``space set-embedding-profile | set-retrieval-profile | validate``: one call to
        :mod:`spaces.profiles`; prints the readiness and both profiles."""
        space = spaces.get_space_by_slug(principal, options["slug"])
        action = options["action"]
        if action == "set-embedding-profile":
            selection = {
                "plugin_id": options["plugin_id"],
                "provider": options["provider"],
                "model": options["model"],
            }
            space = profiles.set_embedding_profile(
                principal, space.id, selection, expected_revision=options["revision"]
            )
        elif action == "set-retrieval-profile":

            def selection_of(values):
                return dict(zip(("plugin_id", "provider", "model"), values, strict=True))

            body = {
                "default_mode": options["default_mode"],
                "top_k": options["top_k"],
                "score_threshold": options["score_threshold"],
                "reasoning_model": (
                    selection_of(options["reasoning_model"]) if options["reasoning_model"] else None
                ),
                "rerank": (
                    {"enabled": True, "model": selection_of(options["rerank_model"])}
                    if options["rerank_model"]
                    else {"enabled": False, "model": None}
                ),
            }
            space = profiles.set_retrieval_profile(
                principal, space.id, body, expected_revision=options["revision"]
            )
        else:
            space = profiles.validate_space(principal, space.id)
        described = profiles.describe(profiles.profile_of(space))
        readiness, embedding = described["readiness"], described["embedding_profile"]
        failure = readiness["failure"]
        lines = [
            f"space {space.slug}: {readiness['state']}"
            + (
                f" ({failure['code']} on {failure['field']}: {failure['message']})"
                if failure
                else ""
            ),
            f"embedding: {embedding['plugin_id']}/{embedding['provider']}/{embedding['model']} "
            f"(dimension {embedding['dimension']}, revision {embedding['revision']})",
            f"retrieval: {json.dumps(described['retrieval_profile'], sort_keys=True)}",
        ]
        self.emit(options, {"slug": space.slug, **described}, "\n".join(lines))

    def apikey(self, options: dict) -> None:
        if options["action"] == "revoke":
            key = spaces.describe_api_key(spaces.revoke_api_key(options["key"]))
            self.emit(options, key, f"revoked key {key['prefix']}… of tenant {key['tenant_id']}")
            return
        tenant = spaces.validate_tenant_id(options["tenant"])
        if options["action"] == "list":
            rows = [spaces.describe_api_key(k) for k in spaces.list_api_keys(tenant)]
            self.emit(
                options,
                {"items": rows},
                "\n".join(_key_line(r) for r in rows) or f"no keys in tenant {tenant}",
            )
            return
        principal = spaces.Principal(tenant_id=tenant)
        bound = [spaces.get_space_by_slug(principal, slug) for slug in options["space"]]
        key, secret = spaces.create_api_key(
            tenant, spaces=bound, datasets=options["dataset"], name=options["name"]
        )
        payload = {
            "id": str(key.id),
            "prefix": key.prefix,
            "secret": secret,
            "tenant_id": tenant,
            "bindings": spaces.describe_api_key(key)["bindings"],
            # earlier names of the same values
            "key": secret,
            "spaces": [s.slug for s in bound],
        }
        self.emit(options, payload, f"{secret}\n(shown once; prefix {key.prefix})")

    def ingest(self, options: dict) -> None:
        space = self._space(options)
        files = _collect_files(options["paths"])
        if not files:
            raise CommandError("no files found under the given paths")
        admitted, skipped, rejected = [], [], []
        policy = options["on_duplicate"]
        limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
        for path in tqdm(files, desc="upload", unit="file", disable=options["json"]):
            if path.stat().st_size > limit:  # refused before the file is read
                rejected.append(
                    {
                        "path": str(path),
                        "code": "file_too_large",
                        "message": upload_limit_message(limit),
                    }
                )
                continue
            try:
                admission = documents.admit_document(
                    space,
                    filename=path.name,
                    data=path.read_bytes(),
                    on_duplicate="reject" if policy == "skip" else policy,
                    enqueue=not options["wait"],
                )
                admitted.append(admission.document.id)
            except Conflict as exc:
                if policy != "skip" or exc.code != "duplicate_document":
                    rejected.append({"path": str(path), "code": exc.code, "message": exc.message})
                else:
                    skipped.append({"path": str(path), "reason": exc.message})
            except ServiceError as exc:
                rejected.append({"path": str(path), "code": exc.code, "message": exc.message})
        if options["wait"] and admitted:
            with tqdm(
                total=len(admitted), desc="compile", unit="doc", disable=options["json"]
            ) as bar:
                compilation.drain_queued(space.id, document_ids=admitted, on_progress=bar.update)
            # A running worker cluster may have taken some of them: wait for those too.
            if any(p < 100 for p in reports.latest_job_percents(admitted).values()):
                self._follow(admitted, quiet=options["json"])
        elif options["follow"] and admitted:
            self._follow(admitted, quiet=options["json"])
        rows = list(
            Document.objects.filter(id__in=admitted).values(
                "id", "filename", "state", "error_code", "error_message", "node_count"
            )
        )
        failed = [r for r in rows if r["state"] == DocumentState.FAILED]
        payload = {
            "space": space.slug,
            "admitted": [{**r, "id": str(r["id"])} for r in rows],
            "skipped": skipped,
            "rejected": rejected,
        }
        lines = [
            f"{r['state']:<10} {r['node_count']:>5} nodes  {r['filename']}"
            + (f"  [{r['error_code']}: {r['error_message']}]" if r["error_code"] else "")
            for r in rows
        ]
        lines += [f"skipped    {s['path']}: already in the space" for s in skipped]
        lines += [f"rejected   {r['path']}: {r['code']}: {r['message']}" for r in rejected]
        self.emit(options, payload, "\n".join(lines))
        if options["wait"] and (failed or rejected):
            raise CommandError(f"{len(failed)} documents failed, {len(rejected)} files rejected")

    def _follow(self, document_ids: list, *, quiet: bool) -> None:
        """A progress bar over the documents' latest jobs (percent summed) until all ended."""
        with tqdm(total=100 * len(document_ids), desc="compile", unit="%", disable=quiet) as bar:
            while True:
                percents = reports.latest_job_percents(document_ids)
                done = sum(percents.values())
                bar.update(done - bar.n)
                if all(p == 100 for p in percents.values()):
                    return
                time.sleep(0.5)

    def query(self, options: dict) -> None:
        space = self._space(options)
        filters = answer_cli.filters_value(options.get("filters"))
        result = retrieve(
            space,
            options["text"],
            top_k=options["top_k"],
            mode=options["mode"],
            score_threshold=options.get("threshold", PROFILE),
            filters=filters,
        )
        payload = result.as_dict()
        lines = []
        for n, item in enumerate(result.items, 1):
            c = item.citation
            where = c["filename"] + (f" p.{c['page_number']}" if c["page_number"] else "")
            if c["section_path"]:
                where += " › " + " › ".join(c["section_path"])
            snippet = " ".join(item.text.split())[:240]
            if item.context is not None:
                where += f"  (context: {item.context['relation']})"
            lines.append(
                f"[{n}] {item.score:.3f}  {where}  [{c['start_offset']}:{c['end_offset']}]"
                f"\n    {snippet}"
            )
        self.emit(options, payload, "\n".join(lines) or "no results")

    def documents(self, options: dict) -> None:
        space = self._space(options)
        rows = [
            {
                "id": str(d.id),
                "filename": d.filename,
                "state": d.state,
                "error_code": d.error_code or None,
                "nodes": d.node_count,
            }
            for d in documents.documents_in(space)
        ]
        self.emit(
            options,
            {"items": rows},
            "\n".join(f"{r['state']:<10} {r['nodes']:>5}  {r['filename']}" for r in rows)
            or "no documents",
        )

    def research_tasks(self, options: dict) -> None:
        """``kfs research-tasks``: the tenant's tasks as an operator sees them (every owner;
        :func:`retrieval.research_tasks.service.visible_tasks`), newest first."""
        from retrieval.research_tasks import service as research_tasks

        if not 1 <= options["limit"] <= 1000:
            raise CommandError(f"invalid_limit: --limit must be 1 to 1000, not {options['limit']}")
        principal = spaces.Principal(tenant_id=spaces.validate_tenant_id(options["tenant"]))
        tasks = research_tasks.visible_tasks(principal).select_related("space")
        if options["space"]:
            tasks = tasks.filter(space=self._space(options))
        if options["status"]:
            tasks = tasks.filter(run_state=options["status"])
        rows = [
            {
                "id": str(t.id),
                "space": t.space.slug,
                "owner": t.owner,
                "status": t.run_state,
                "stage": t.stage,
                "query": t.query[:200],
                "attempts": t.attempt_count,
                "error_code": t.error_code or None,
                "elapsed_ms": t.elapsed_ms,
                "created_at": t.created_at.isoformat(),
            }
            for t in tasks.order_by("-created_at", "-id")[: options["limit"]]
        ]
        self.emit(
            options,
            {"items": rows},
            "\n".join(
                f"{r['id']}  {r['status']:<9} {r['space']:<20} {r['owner']:<24} {r['query'][:60]}"
                for r in rows
            )
            or "no research tasks",
        )

    def jobs(self, options: dict) -> None:
        space = self._space(options)
        rows = [
            _job_row(job)
            for job in reports.jobs_in(space, state=options["state"])[: max(1, options["limit"])]
        ]
        lines = [
            f"{r['state']:<16} {r['progress']['percent']:>3}%  {r['filename']}  {r['id']}"
            + (f"  [{r['error_code']}]" if r["error_code"] else "")
            for r in rows
        ]
        self.emit(options, {"items": rows}, "\n".join(lines) or "no jobs")

    def stats(self, options: dict) -> None:
        payload = reports.space_stats(self._space(options))
        self.emit(options, payload, json.dumps(payload, indent=2))

    def retry(self, options: dict) -> None:
        job = compilation.retry_job(options["job_id"], from_checkpoint=not options["from_start"])
        self.emit(options, _job_row(job), f"queued attempt {job.attempt_number}: {job.id}")

    def cancel(self, options: dict) -> None:
        job = compilation.cancel_job(options["job_id"])
        self.emit(options, _job_row(job), f"canceled {job.id}")

    def schedules(self, options: dict) -> None:
        from knowledgefs.jobs.schedules import ensure
        from retrieval.research_tasks.dispatch import SWEEP_SCHEDULE
        from upgrades.services.reconciliation import RECOVERY_SCHEDULE

        schedule = compilation.ensure_recovery_schedule()
        payload = {
            "name": schedule.name,
            "func": schedule.func,
            "minutes": schedule.minutes,
            "next_run": schedule.next_run.isoformat() if schedule.next_run else None,
        }
        # The upgrade reconciliation recovery tick (migration upgrades.0020) is repaired too.
        upgrade = ensure(RECOVERY_SCHEDULE)
        # The research tasks' recovery sweep (migration retrieval.0006) is repaired too.
        research = ensure(SWEEP_SCHEDULE)
        payload["also"] = [
            {"name": s.name, "func": s.func, "minutes": s.minutes} for s in (upgrade, research)
        ]
        self.emit(
            options,
            payload,
            f"{schedule.name}: {schedule.func} every {schedule.minutes} min "
            f"(next {payload['next_run']})\n"
            f"{upgrade.name}: {upgrade.func} every {upgrade.minutes} min\n"
            f"{research.name}: {research.func} every {research.minutes} min",
        )

    def cutover(self, options: dict) -> None:
        self.stdout.write(json.dumps(cutover_cli.run(options), indent=2))

    def sweep(self, options: dict) -> None:
        report = compilation.recover_jobs().as_dict()
        self.emit(options, report, json.dumps(report, indent=2))

    def downgrade_check(self, options: dict) -> None:
        """The plan and the refusals (knowledgefs.downgrades); exit status 3 when refused."""
        alias = options["database"]
        if alias not in connections:
            raise CommandError(
                f"--database {alias!r} is not configured (known: {', '.join(connections)})"
            )
        result = downgrades.check_downgrade(
            connections[alias], options["app_label"], options["migration"]
        )
        lines = [
            f"plan for migrate {result.target[0]} {result.target[1]}: {len(result.plan)} step(s)"
        ]
        lines += [f"  {name}  {direction}" for name, direction in result.plan]
        lines += [f"refused: {r.text()}" for r in result.refusals]
        lines.append("allowed" if result.allowed else "refused: nothing was changed")
        self.emit(options, result.as_dict(), "\n".join(lines))
        if not result.allowed:
            raise downgrades.DowngradeRefused(
                f"{len(result.refusals)} refusal(s) for migrate {' '.join(result.target)}"
            )

    def eval(self, options: dict) -> None:
        """``kfs eval``: one run per ``--mode`` over a BEIR dataset or (``--golden``) a space's
        golden questions; ``--write-baseline`` records them, ``--baseline`` gates them
        (exit status 1 naming mode, metric, baseline, measured and drop when a drop exceeds
        ``--max-drop``). Baseline format: :mod:`retrieval.evaluation`, docs/retrieval.md."""
        modes = [m.strip() for m in options["mode"].split(",") if m.strip()]
        if not modes:
            raise CommandError("--mode names no mode")
        if options["max_drop"] is not None and not options["baseline"]:
            raise CommandError(
                "--max-drop sets the regression gate's allowed drop: give --baseline"
            )
        if options["baseline"] and "auto" in modes:
            raise CommandError(
                "--mode auto cannot be gated: it resolves to a space's default mode, which a "
                "baseline does not record; gate the concrete modes (fast, deep, research)"
            )
        baseline = (
            evaluation.load_baseline(Path(options["baseline"])) if options["baseline"] else None
        )
        bars: dict[str, tqdm] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if options["json"]:
                return
            bar = bars.setdefault(phase, tqdm(total=total, desc=phase, unit="item"))
            bar.update(done - bar.n)

        runs = []
        for mode in modes:
            if options["golden"]:
                if not (options["space"] and options["tenant"]) or options["dataset_dir"]:
                    raise CommandError("--golden needs --space and --tenant, and no DATASET_DIR")
                runs.append(
                    golden.run_golden(
                        self._space(options),
                        mode=mode,
                        top_k=10 if options["top_k"] is None else options["top_k"],
                        tags=options["tag"],
                        on_progress=progress,
                    )
                )
            else:
                if not options["dataset_dir"]:
                    raise CommandError("give a DATASET_DIR, or --golden --space S --tenant T")
                runs.append(
                    evaluation.evaluate(
                        Path(options["dataset_dir"]),
                        split=options["split"],
                        mode=mode,
                        legs=LEGS if options["legs"] == "hybrid" else (options["legs"],),
                        fusion=options["fusion"],
                        fresh=options["fresh"] and not runs,
                        top_k=options["top_k"] or 100,
                        on_progress=progress,
                    )
                )
            for bar in bars.values():
                bar.close()
            bars.clear()
        payload: dict = runs[0] if len(runs) == 1 else {"runs": runs}
        if options["write_baseline"]:
            evaluation.write_baseline(Path(options["write_baseline"]), runs)
        gate = None
        if baseline is not None:
            max_drop = 0.01 if options["max_drop"] is None else options["max_drop"]
            gate = evaluation.check_gate(runs, baseline, max_drop)
            payload = {**payload, "gate": gate}
        self.emit(options, payload, json.dumps(payload, indent=2, ensure_ascii=False))
        if gate is not None:
            for note in gate["notes"]:
                self.stderr.write(f"note: {note}")
            if not gate["passed"]:
                raise CommandError("regression gate failed: " + "; ".join(gate["failures"]))
            self.stderr.write(f"regression gate passed ({len(gate['checks'])} checks)")


def _key_line(key: dict) -> str:
    """One ``kfs apikey list`` line: prefix, state, name, bindings, created, last used."""
    bindings = ",".join(
        b["space_slug"] if b["type"] == "knowledge_fs_space" else f"dataset:{b['dataset_id']}"
        for b in key["bindings"]
    )
    return "\t".join(
        [
            key["prefix"],
            key["state"],
            key["name"] or "-",
            bindings or "(whole tenant)",
            f"created {key['created_at']}",
            f"last used {key['last_used_at'] or 'never'}",
        ]
    )


def _job_row(job) -> dict:
    data = JobSerializer(job).data
    return {
        "id": str(job.id),
        "document_id": str(job.document_id),
        "filename": job.document.filename,
        "state": data["state"],
        "stage": job.stage,
        "run_state": job.run_state,
        "progress": data["progress"],
        "attempt_number": job.attempt_number,
        "error_code": job.error_code or None,
        "error_message": job.error_message or None,
    }


def _collect_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(
                sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            files.append(path)
        else:
            raise CommandError(f"no such file or folder: {raw}")
    return files
