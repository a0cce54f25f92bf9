"""The HTTP face of the test API server: Kubernetes REST paths, discovery, list/watch streams.

`KubeTestServer` runs an aiohttp application on 127.0.0.1 (a free port) in a background thread
with its own event loop, so that synchronous clients (the kubernetes package) and kopf's own
loop in another thread both talk to it over real HTTP."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import re
import secrets
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from . import admission, admission_policy, errors, rbac, resources
from .patches import apply_patch
from .schema import validate_object
from .selectors import field_selector, label_selector
from .store import Store, Watcher
from .tables import table, wants_table

TOKEN = "stepscope-test-token"
log = logging.getLogger(__name__)
ADMIN = rbac.User("kubernetes-admin", ("system:masters", "system:authenticated"))


def _is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("true", "1")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


class Api:
    """Request routing over one Store."""

    def __init__(self, store: Store, token: str | None, bookmark_interval_s: float) -> None:
        self.store = store
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.requests: list[tuple[str, str]] = []  # (method, path?query), for tests that check what a client asked
        self.users: dict[str, rbac.User] = {}
        # (namespace, service) -> (host, port): where a webhook's clientConfig.service is reached.
        self.service_endpoints: dict[tuple[str, str], tuple[str, int]] = {}
        if token:
            self.users[token] = ADMIN
        self.closing = asyncio.Event()
        # [method, path, code, times left]: the next requests that answer `code` instead (KubeTestServer.fail).
        self.faults: list[list[Any]] = []

    def _fault(self, request: web.Request) -> errors.ApiError | None:
        for fault in self.faults:
            method, path, code, _ = fault
            if request.method == method and request.path == path:
                fault[3] -= 1
                if fault[3] <= 0:
                    self.faults.remove(fault)
                return errors.ApiError(code, "ServiceUnavailable" if code == 503 else "InternalError", f"injected failure {code}")
        return None

    def _user(self, request: web.Request) -> rbac.User:
        if not self.token:
            return ADMIN
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = self.users.get(token) if scheme == "Bearer" else None
        if user is None:
            raise errors.ApiError(401, "Unauthorized", "Unauthorized")
        return user

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if (fault := self._fault(request)) is not None:
            return _json(fault.status(), fault.code)
        try:
            return await self._route(request, self._user(request))
        except errors.ApiError as e:
            return _json(e.status(), e.code)
        except Exception as e:  # a bug of this test double: say so in the response, as a Status
            log.exception("test API server failed on %s %s", request.method, request.path_qs)
            return _json(errors.ApiError(500, "InternalError", f"test API server bug: {e!r}").status(), 500)

    async def _route(self, request: web.Request, user: rbac.User) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts or parts[0] in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if parts == ["version"]:
            return _json({"major": "1", "minor": "31", "gitVersion": "v1.31.0-stepscope-test", "gitCommit": "0" * 40,
                          "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22",
                          "compiler": "gc", "platform": "linux/amd64"})
        if parts[0] == "api":
            if len(parts) == 1:
                return _json({"kind": "APIVersions", "versions": ["v1"],
                              "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            if len(parts) == 1:
                return _json(resources.group_list(self.store.all_types()))
            if len(parts) == 2:
                versions = [t.version for t in self.store.all_types() if t.group == parts[1]]
                if not versions:
                    raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
                return _json(resources.group_document(parts[1], list(dict.fromkeys(versions))))
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        if (group, version, rest, request.method) == ("authorization.k8s.io", "v1", ["subjectaccessreviews"], "POST"):
            return _json(self._access_review(await self._body(request)), 201)
        if not rest:
            types = self.store.types_in(group, version)
            if not types:
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
            return _json(resources.resource_list(f"{group}/{version}" if group else version, types))
        return await self._resource(request, user, group, version, rest)

    def _authorize(self, request: web.Request, user: rbac.User, t: resources.ResourceType,
                   namespace: str | None, name: str | None, subresource: str) -> None:
        if user.is_admin:
            return
        if name is None:
            verb = {"GET": "watch" if _is_watch(request) else "list",
                    "POST": "create", "DELETE": "deletecollection"}.get(request.method, request.method.lower())
            # list/watch of one named object is what a Role with resourceNames can allow.
            selected = re.fullmatch(r"metadata\.name==?([^,]+)", request.query.get("fieldSelector", ""))
            name = selected.group(1) if selected and verb in ("list", "watch") else None
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}.get(request.method, request.method.lower())
        attrs = rbac.Attributes(verb, t.group, t.plural, subresource, namespace, name)
        if not rbac.allowed(self._rbac_objects(), user, attrs):
            raise rbac.forbidden(user, attrs)

    def _access_review(self, review: dict[str, Any]) -> dict[str, Any]:
        """A SubjectAccessReview (what `kubectl auth can-i --as` asks): the stored RBAC's answer for
        the named user and groups. Not done: nonResourceAttributes, extra, uid, a reason."""
        spec = review.get("spec") or {}
        user = rbac.User(spec.get("user") or "", tuple(spec.get("groups") or ()))
        a = spec.get("resourceAttributes") or {}
        attrs = rbac.Attributes(a.get("verb") or "", a.get("group") or "", a.get("resource") or "", a.get("subresource") or "",
                                a.get("namespace") or None, a.get("name") or None)
        allowed = user.is_admin or rbac.allowed(self._rbac_objects(), user, attrs)
        return {**review, "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "status": {"allowed": allowed}}

    def _rbac_objects(self) -> dict[str, list[dict[str, Any]]]:
        return {kind: self.store.stored(rbac.RBAC, plural) for kind, plural in
                (("Role", "roles"), ("RoleBinding", "rolebindings"), ("ClusterRole", "clusterroles"),
                 ("ClusterRoleBinding", "clusterrolebindings"))}

    def _admit(self, user: rbac.User, t: resources.ResourceType, namespace: str | None, body: dict[str, Any]) -> None:
        """What kube-apiserver checks on a create beyond authorization: the RBAC escalation check
        (a Role or binding may grant only what its creator holds) and the admission plugin
        OwnerReferencesPermissionEnforcement (blockOwnerDeletion needs `update` on the owner's
        finalizers)."""
        if user.is_admin:
            return
        objects = self._rbac_objects()
        for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
            if not ref.get("blockOwnerDeletion"):
                continue
            group = ref.get("apiVersion", "").rpartition("/")[0]
            owner = next((o for o in self.store.types.values() if o.group == group and o.kind == ref.get("kind")), None)
            attrs = rbac.Attributes("update", group, owner.plural if owner else ref.get("kind", "").lower(), "finalizers", namespace, ref.get("name"))
            if not rbac.allowed(objects, user, attrs):
                denied = rbac.forbidden(user, attrs).message.partition(" is forbidden: ")[2]
                raise errors.ApiError(403, "Forbidden", f'{t.plural} "{(body.get("metadata") or {}).get("name", "")}" is forbidden: cannot set '
                                      f"blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: {denied}")
        if t.group != rbac.RBAC or t.plural not in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"):
            return
        if t.plural.endswith("bindings"):
            ref = body.get("roleRef") or {}
            if rbac.allowed(objects, user, rbac.Attributes("bind", rbac.RBAC, ref.get("kind", "").lower() + "s", "", namespace, ref.get("name"))):
                return
            role = next((r for r in objects.get(ref.get("kind", ""), []) if r["metadata"]["name"] == ref.get("name")
                         and r["metadata"].get("namespace") == (namespace if ref.get("kind") == "Role" else None)), None)
            rules = (role or {}).get("rules") or []
        else:
            if rbac.allowed(objects, user, rbac.Attributes("escalate", rbac.RBAC, t.plural, "", namespace, None)):
                return
            rules = body.get("rules") or []
        missing = rbac.not_held(objects, user, rules, namespace)
        if missing:
            raise errors.ApiError(403, "Forbidden", f'{t.plural}.{rbac.RBAC} "{(body.get("metadata") or {}).get("name", "")}" is forbidden: '
                                  f'user "{user.name}" is attempting to grant RBAC permissions not currently held:\n' + "\n".join(missing))

    def _validate(self, user: rbac.User, t: resources.ResourceType, namespace: str | None, operation: str,
                  new: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The stored ValidatingAdmissionPolicies on a write (admission_policy.py)."""
        name = (new.get("metadata") or {}).get("name") or ""
        admission_policy.admit(self.store.stored(admission_policy.GROUP, "validatingadmissionpolicies"),
                               self.store.stored(admission_policy.GROUP, "validatingadmissionpolicybindings"),
                               {"operation": operation, "userInfo": {"username": user.name, "groups": list(user.groups)},
                                "resource": {"group": t.group, "version": t.version, "resource": t.plural},
                                "namespace": namespace or "", "name": name, "object": new, "oldObject": old})

    async def _resource(self, request: web.Request, user: rbac.User, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = self.store.types.get((group, version, rest[2]))
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        t = self.store.type_of(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        subresource = "/".join(rest[2:])
        if t.namespaced and namespace is None and (name is not None or request.method != "GET"):
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")
        if subresource and subresource not in t.subresources:
            raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({t.plural}/{subresource})")
        self._authorize(request, user, t, namespace, name, subresource)
        if request.query.get("dryRun"):
            # Refused rather than ignored: ignoring it would store what the client meant to try.
            raise errors.bad_request("dryRun is not supported by the test API server")
        method = request.method
        if name is None:
            if method == "GET":
                if _is_watch(request):
                    return await self._watch(request, t, namespace)
                return self._list(request, t, namespace)
            if method == "POST":
                body, warnings = await self._body(request), []
                self._admit(user, t, namespace, body)
                if isinstance(body, dict):
                    self._validate(user, t, namespace, "CREATE", body, None)
                if t.group == "" and t.plural == "pods" and namespace is not None:
                    self.store.get(self.store.type_of("", "v1", "namespaces"), None, namespace)  # 404 before admission
                    body, warnings = await admission.admit_pod(self.store, namespace, body, self.service_endpoints, user.name)
                response = _json(self.store.create(t, namespace, body), 201)
                for warning in warnings:
                    response.headers.add("Warning", f'299 - "{warning}"')
                return response
            if method == "DELETE":
                items, _ = self.store.list(t, namespace, self._matcher(request, t))
                for item in items:
                    self.store.delete(t, namespace, item["metadata"]["name"])
                return _json({"kind": f"{t.kind}List", "apiVersion": t.api_version, "metadata": {}, "items": items})
        elif method == "POST" and t.plural == "serviceaccounts" and subresource == "token":
            return _json(self._token_request(namespace, name, await self._body(request)), 201)
        elif method == "GET":
            obj = self.store.get(t, namespace, name)
            if wants_table(request.headers.get("Accept", "")):
                return _json(table(t, [obj], obj["metadata"]["resourceVersion"]))
            return _json(obj)
        elif method in ("PUT", "PATCH") and t.group == "" and t.plural == "pods" and not subresource:
            return await self._update_pod(request, user, t, namespace, name)
        elif method == "PUT":
            body = await self._body(request)
            if not subresource and isinstance(body, dict):
                self._validate(user, t, namespace, "UPDATE", body, self.store.get(t, namespace, name))
            return _json(self.store.replace(t, namespace, name, body, subresource))
        elif method == "PATCH":
            patch = await self._body(request)
            content_type = request.headers.get("Content-Type", "")

            def patched(obj: dict[str, Any]) -> dict[str, Any]:
                new = apply_patch(content_type, obj, patch, builtin=t.builtin)
                if not subresource:
                    self._validate(user, t, namespace, "UPDATE", new, obj)
                return new
            return _json(self.store.patch(t, namespace, name, patched, subresource))
        elif method == "DELETE" and not subresource:
            body = await self._body(request, optional=True) or {}
            if "propagationPolicy" in request.query:
                body["propagationPolicy"] = request.query["propagationPolicy"]
            obj = self.store.delete(t, namespace, name, body)
            if t.builtin and t.kind not in ("Pod", "Namespace"):
                return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "details": {"name": name, "group": t.group, "kind": t.plural, "uid": obj["metadata"]["uid"]}})
            return _json(obj)
        raise errors.ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    async def _update_pod(self, request: web.Request, user: rbac.User, t: resources.ResourceType, namespace: str, name: str) -> web.Response:
        """An update of pods/<name> as kube-apiserver runs it: the patch applied to the stored pod,
        then the mutating webhooks (UPDATE, with the stored pod as oldObject), then the update's
        validation (object_rules.pod_update_causes) and the write."""
        old = self.store.get(t, namespace, name)
        body = await self._body(request)
        if request.method == "PUT":
            new = body
        else:
            new = apply_patch(request.headers.get("Content-Type", ""), old, body, builtin=True)
            # A patch names no resourceVersion unless the client put one in it: no 409 from admission's await.
            new.setdefault("metadata", {})["resourceVersion"] = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("resourceVersion")
        new, warnings = await admission.admit_pod(self.store, namespace, new, self.service_endpoints, user.name, old=old)
        response = _json(self.store.replace(t, namespace, name, new))
        for warning in warnings:
            response.headers.add("Warning", f'299 - "{warning}"')
        return response

    def _token_request(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """TokenRequest (what `kubectl create token` calls): a bearer token for the ServiceAccount,
        authorized with RBAC like every ServiceAccount token here. It never expires."""
        self.store.get(self.store.type_of("", "v1", "serviceaccounts"), namespace, name)  # 404 when absent
        token = secrets.token_hex(16)
        self.users[token] = rbac.User.service_account(namespace, name)
        expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=(body.get("spec") or {}).get("expirationSeconds") or 3600))
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {"name": name, "namespace": namespace},
                "spec": body.get("spec") or {}, "status": {"token": token, "expirationTimestamp": expires.replace(microsecond=0).isoformat().replace("+00:00", "Z")}}

    @staticmethod
    async def _body(request: web.Request, optional: bool = False) -> Any:
        raw = await request.read()
        if not raw:
            if optional:
                return None
            raise errors.bad_request("the request has no body")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise errors.bad_request(f"the body of the request is not JSON: {e}") from e

    @staticmethod
    def _matcher(request: web.Request, t: resources.ResourceType):
        labels = label_selector(request.query.get("labelSelector"))
        fields = field_selector(request.query.get("fieldSelector"), t.kind)
        return lambda obj: labels(obj) and fields(obj)

    def _list(self, request: web.Request, t: resources.ResourceType, namespace: str | None) -> web.Response:
        items, rv = self.store.list(t, namespace, self._matcher(request, t))
        meta: dict[str, Any] = {"resourceVersion": rv}
        if request.query.get("continue"):
            rv, after = _read_continue(request.query["continue"])
            if int(rv) < self.store.oldest_rv():
                raise errors.ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                                      "list result. You can start a new list without the continue parameter.")
            items = [i for i in items if (i["metadata"].get("namespace", ""), i["metadata"]["name"]) > after]
            meta["resourceVersion"] = rv
        limit = int(request.query.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            meta["continue"] = _write_continue(meta["resourceVersion"], (last.get("namespace", ""), last["name"]))
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if wants_table(request.headers.get("Accept", "")):
            return _json(table(t, items, meta["resourceVersion"]))
        return _json({"kind": f"{t.kind}List", "apiVersion": t.api_version, "metadata": meta, "items": items})

    async def _watch(self, request: web.Request, t: resources.ResourceType, namespace: str | None) -> web.StreamResponse:
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        initial = request.query.get("sendInitialEvents") == "true"
        if initial and not (bookmarks and request.query.get("resourceVersionMatch") == "NotOlderThan"):
            raise errors.ApiError(422, "Invalid", "sendInitialEvents needs allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan")
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        try:
            watcher = self.store.watch(t, namespace, self._matcher(request, t), request.query.get("resourceVersion"), initial)
        except errors.ApiError as e:
            if e.code != 410:
                raise
            # The API server says "Gone" inside a 200 stream, as an ERROR event.
            await response.prepare(request)
            await response.write(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
            return response
        await response.prepare(request)
        timeout = float(request.query.get("timeoutSeconds") or 0) or None
        try:
            await asyncio.wait_for(self._stream(response, watcher, t if bookmarks else None), timeout)
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self.store.watchers.discard(watcher)
        return response

    async def _stream(self, response: web.StreamResponse, watcher: Watcher, bookmarks_of: resources.ResourceType | None) -> None:
        """Write the watcher's events as JSON lines; when bookmarks are allowed, a BOOKMARK after
        every `bookmark_interval_s` without events."""
        closing = asyncio.ensure_future(self.closing.wait())
        getter: asyncio.Future | None = None
        interval = self.bookmark_interval_s if bookmarks_of is not None else None
        try:
            while True:
                getter = asyncio.ensure_future(watcher.queue.get())
                await asyncio.wait({getter, closing}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                if closing.done():
                    return
                if getter.done():
                    event = getter.result()
                else:
                    getter.cancel()
                    event = self.store.bookmark(bookmarks_of)
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            closing.cancel()
            if getter is not None:
                getter.cancel()


def _write_continue(resource_version: str, after: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": resource_version, "after": after}).encode()).decode()


def _read_continue(token: str) -> tuple[str, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["rv"]), (str(data["after"][0]), str(data["after"][1]))
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise errors.bad_request(f"invalid continue token {token!r}") from e


class KubeTestServer:
    """Start with `start()` (or as a context manager); `url`, `token`, `write_kubeconfig(path)`."""

    def __init__(self, token: str | None = TOKEN, bookmark_interval_s: float = 60.0) -> None:
        """bookmark_interval_s: quiet time after which a watch that allows bookmarks gets one
        (the API server sends them about once a minute)."""
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-test-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self.api: Api | None = None

    def start(self) -> KubeTestServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self.api = Api(Store(validate_object), self.token, self.bookmark_interval_s)
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.api.handle)
        # handler_cancellation: a watch whose client went away ends at once and drops its watcher.
        # access_log=None: one log line per request would bury the logs of the tests that use it.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # the free port the OS chose
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        async def _stop() -> None:
            assert self.api is not None and self._runner is not None
            self.api.closing.set()
            await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> KubeTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn, *args: Any) -> Any:
        """Run `fn(store, *args)` on the server's loop (for assertions on the stored state)."""
        async def _call() -> Any:
            return fn(self.api.store, *args)
        return asyncio.run_coroutine_threadsafe(_call(), self._loop).result(timeout=30)

    def fail(self, method: str, path: str, code: int = 503, times: int = 1) -> None:
        """The next `times` requests `method path` (no query) answer `code` with a Status, as an
        API server blip would; the requests after them are served."""
        self.call(lambda _store: self.api.faults.append([method, path, code, times]))

    def requests(self) -> list[tuple[str, str]]:
        """(method, path with query) of every request so far, in order."""
        return self.call(lambda _store: list(self.api.requests))

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for system:serviceaccount:<namespace>:<name>, checked against RBAC."""
        token = secrets.token_hex(16)
        self.call(lambda _store: self.api.users.__setitem__(token, rbac.User.service_account(namespace, name)))
        return token

    def write_kubeconfig(self, path: Path, namespace: str = "default", token: str | None = None) -> Path:
        """A kubeconfig for the admin token, or for `token` (see service_account_token)."""
        token = token or self.token
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "stepscope-test",
            "clusters": [{"name": "stepscope-test", "cluster": {"server": self.url}}],
            "users": [{"name": "stepscope-test", "user": {"token": token} if token else {}}],
            "contexts": [{"name": "stepscope-test",
                          "context": {"cluster": "stepscope-test", "user": "stepscope-test", "namespace": namespace}}],
        }
        path.write_text(json.dumps(config, indent=2))
        return path
