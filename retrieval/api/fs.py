"""The knowledge filesystem over HTTP: ``GET /v1/knowledge-spaces/{id}/fs/{op}`` and the safe
shell's ``POST …/fs/shell/{plan,execute}`` (docs/filesystem.md). Each route is one registered
operation ``knowledge_fs.<op>``; the work is :mod:`retrieval.fs`."""

from __future__ import annotations

from rest_framework.response import Response

from knowledgefs.auth.operations import READ_CALLERS, WRITE_CALLERS, Operation, space_from
from knowledgefs.errors import InvalidInput
from spaces.services import get_space

from ..fs import grep, listing, reading, shell
from ..fs.evidence import Caller
from .views import RouteView, refuse_unknown_members

#: MCP sessions (caller kind ``mcp``) reach the filesystem like the other read callers.
FS_CALLERS = READ_CALLERS | {"mcp"}
FS_WRITE_CALLERS = WRITE_CALLERS | {"mcp"}


class FsView(RouteView):
    """Base of the filesystem routes: the space first (a foreign or out-of-scope space is 404
    before any parameter is read), then the operation with the query parameters."""

    op = ""
    params: tuple[str, ...] = ()

    def get(self, request, space_id):
        space = get_space(request.user, space_id)
        query = request.query_params
        unknown = sorted(set(query) - set(self.params))
        if unknown:
            raise InvalidInput(
                f"{unknown[0]}: not a parameter of fs/{self.op} "
                f"(parameters: {', '.join(self.params)})",
                code="invalid_request",
                details={"field": unknown[0]},
            )
        repeated = sorted(name for name in query if len(query.getlist(name)) > 1)
        if repeated:
            raise InvalidInput(
                f"{repeated[0]}: given {len(query.getlist(repeated[0]))} times; send each "
                f"parameter of fs/{self.op} once",
                code="invalid_request",
                details={"field": repeated[0]},
            )
        caller = Caller.of(request.user)
        return Response(self.run(space, {name: query.get(name) for name in self.params}, caller))

    def run(self, space, p: dict, caller: Caller) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


def fs_operation(name: str) -> dict:
    return {"GET": Operation(f"knowledge_fs.{name}", space_from(), FS_CALLERS)}


class FsLsView(FsView):
    op, params = "ls", ("path", "limit", "cursor")
    operations = fs_operation("ls")

    def run(self, space, p, caller):
        return listing.ls(space, p["path"], p["limit"], p["cursor"], caller)


class FsTreeView(FsView):
    op, params = "tree", ("path", "limit", "cursor", "depth")
    operations = fs_operation("tree")

    def run(self, space, p, caller):
        return listing.tree_listing(space, p["path"], p["limit"], p["depth"], p["cursor"], caller)


class FsCatView(FsView):
    op, params = "cat", ("path", "limit", "cursor")
    operations = fs_operation("cat")

    def run(self, space, p, caller):
        return reading.cat(space, p["path"], p["limit"], p["cursor"], caller)


class FsStatView(FsView):
    op, params = "stat", ("path",)
    operations = fs_operation("stat")

    def run(self, space, p, caller):
        return reading.stat(space, p["path"], caller)


class FsGrepView(FsView):
    op, params = "grep", ("q", "path", "limit", "cursor", "timeoutMs")
    operations = fs_operation("grep")

    def run(self, space, p, caller):
        return grep.grep(space, p["q"], p["path"], p["limit"], p["cursor"], p["timeoutMs"])


class FsFindView(FsView):
    op = "find"
    params = (
        "path", "limit", "cursor", "nameContains", "metadataKey", "metadataValue", "resourceType",
    )  # fmt: skip
    operations = fs_operation("find")

    def run(self, space, p, caller):
        return listing.find(
            space, p["path"], p["limit"], p["cursor"], name_contains=p["nameContains"],
            metadata_key=p["metadataKey"], metadata_value=p["metadataValue"],
            resource_type=p["resourceType"], caller=caller,
        )  # fmt: skip


class FsDiffView(FsView):
    op, params = "diff", ("oldPath", "newPath", "mode")
    operations = fs_operation("diff")

    def run(self, space, p, caller):
        return reading.diff(space, p["oldPath"], p["newPath"], p["mode"])


class FsOpenNodeView(FsView):
    op, params = "open_node", ("node_id", "nodeId")
    operations = fs_operation("open_node")

    def run(self, space, p, caller):
        return reading.open_node(space, p["node_id"] or p["nodeId"])


class ShellView(RouteView):
    def post(self, request, space_id):
        space = get_space(request.user, space_id)
        body = request.data
        if not isinstance(body, dict):
            raise InvalidInput("body must be a JSON object", code="invalid_request")
        refuse_unknown_members(body, ("command",), "shell")
        return Response(self.run(space, body.get("command"), Caller.of(request.user)))

    def run(self, space, command, caller: Caller) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


class ShellPlanView(ShellView):
    operations = {"POST": Operation("knowledge_fs.shell_plan", space_from(), FS_CALLERS)}

    def run(self, space, command, caller):
        return shell.plan(command)


class ShellExecuteView(ShellView):
    operations = {"POST": Operation("knowledge_fs.shell_execute", space_from(), FS_WRITE_CALLERS)}

    def run(self, space, command, caller):
        return shell.execute(space, command, caller)
