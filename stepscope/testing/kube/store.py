"""Objects, resource versions, watch history and the API server's object lifecycle rules
(status subresource, generation, finalizers, owner-reference garbage collection).

Everything here runs on the server's event-loop thread, so no locks: a mutation and the events
it emits happen without an await in between, which keeps watch replay gap-free."""
from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import random
import string
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .resources import ResourceType, builtin_types, crd_types

Obj = dict[str, Any]
Predicate = Callable[[Obj], bool]
Key = tuple[str, str]  # (group, plural): every served version of a resource shares one storage
HISTORY = 1000  # watch events kept for resuming; older resourceVersions get 410 Gone
Validator = Callable[[ResourceType, Obj, Obj | None], Obj]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(t: ResourceType, obj: Obj) -> Obj:
    """What metadata.generation tracks: everything but metadata, and status where it has its own
    subresource (without one, a status change is a change like any other)."""
    ignored = ("metadata", "kind", "apiVersion", *(("status",) if "status" in t.subresources else ()))
    return {k: v for k, v in obj.items() if k not in ignored}


def _normalized(t: ResourceType, obj: Obj) -> Obj:
    """What the API server does to built-in objects on every write that clients depend on:
    a Secret's write-only stringData lands base64-encoded in data (and is never read back)."""
    if (t.group, t.kind) == ("", "Secret"):
        obj.setdefault("type", "Opaque")
        strings = obj.pop("stringData", None) or {}
        if strings:
            obj["data"] = {**(obj.get("data") or {}),
                           **{k: base64.b64encode(str(v).encode()).decode() for k, v in strings.items()}}
    return obj


@dataclass
class Event:
    rv: int
    type: str
    key: Key
    obj: Obj
    old: Obj | None = None


@dataclass(eq=False)
class Watcher:
    key: Key
    namespace: str | None
    matches: Predicate
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def offer(self, event: Event) -> None:
        """Queue the event as this watcher sees it: objects entering or leaving its selector
        arrive as ADDED / DELETED, like the API server's watch cache does."""
        if event.key != self.key or (self.namespace and event.obj["metadata"].get("namespace") != self.namespace):
            return
        now_in = self.matches(event.obj)
        was_in = event.old is not None and self.matches(event.old)
        kind = event.type
        if kind == "MODIFIED" and now_in != was_in:
            kind = "ADDED" if now_in else "DELETED"
        elif not now_in:
            return
        self.queue.put_nowait({"type": kind, "object": copy.deepcopy(event.obj)})


class Store:
    def __init__(self, validate: Validator) -> None:
        self.validate = validate
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        for t in builtin_types():
            self.types[(t.group, t.version, t.plural)] = t
        self.objects: dict[Key, dict[tuple[str, str], Obj]] = {}
        self.rv = 1
        self.history: deque[Event] = deque(maxlen=HISTORY)
        self.watchers: set[Watcher] = set()
        for ns in ("default", "kube-system"):
            self.create(self.type_of("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # -- types ---------------------------------------------------------------------------------
    def type_of(self, group: str, version: str, plural: str) -> ResourceType:
        t = self.types.get((group, version, plural))
        if t is None:
            gv = f"{group}/{version}" if group else version
            raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({plural} in {gv})")
        return t

    def types_in(self, group: str, version: str) -> list[ResourceType]:
        return [t for (g, v, _), t in self.types.items() if (g, v) == (group, version)]

    def all_types(self) -> list[ResourceType]:
        return list(self.types.values())

    # -- reads ---------------------------------------------------------------------------------
    def _bucket(self, t: ResourceType) -> dict[tuple[str, str], Obj]:
        return self.objects.setdefault((t.group, t.plural), {})

    def _stored(self, t: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._bucket(t).get((namespace or "", name))
        if obj is None:
            raise errors.not_found(t.qualified, name)
        return obj

    def _out(self, t: ResourceType, obj: Obj) -> Obj:
        """A copy as a client of this version sees it."""
        result = copy.deepcopy(obj)
        result["apiVersion"] = t.api_version
        result["kind"] = t.kind
        return result

    def stored(self, group: str, plural: str) -> list[Obj]:
        """The stored objects of one resource, uncopied: for reading on the server's loop only."""
        return list(self.objects.get((group, plural), {}).values())

    def get(self, t: ResourceType, namespace: str | None, name: str) -> Obj:
        return self._out(t, self._stored(t, namespace, name))

    def list(self, t: ResourceType, namespace: str | None, matches: Predicate) -> tuple[list[Obj], str]:
        items = [self._out(t, o) for (ns, _), o in sorted(self._bucket(t).items())
                 if (namespace is None or ns == namespace) and matches(o)]
        return items, str(self.rv)

    # -- writes --------------------------------------------------------------------------------
    def _emit(self, t: ResourceType, kind: str, obj: Obj, old: Obj | None = None) -> None:
        event = Event(self.rv, kind, (t.group, t.plural), self._out(t, obj), old)
        self.history.append(event)
        for watcher in list(self.watchers):
            watcher.offer(event)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def create(self, t: ResourceType, namespace: str | None, body: Obj) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if t.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent on the request")
            if ("", namespace or "") not in self._bucket(self.type_of("", "v1", "namespaces")):
                raise errors.not_found("namespaces", namespace or "")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise errors.invalid(t.kind, t.group, "", [("metadata.name", "Required value: name or generateName is required")])
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        if self._index(t, obj) in self._bucket(t):
            raise errors.already_exists(t.qualified, meta["name"])
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(server_field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if "status" in t.subresources:
            obj.pop("status", None)
        obj.update(self._initial_status(t, obj))
        obj = self.validate(t, _normalized(t, obj), None)
        meta = obj["metadata"]
        meta["resourceVersion"] = self._next_rv()
        self._bucket(t)[self._index(t, obj)] = obj
        self._emit(t, "ADDED", obj)
        if t.kind == "CustomResourceDefinition":
            self._register_crd(obj)
        return self._out(t, obj)

    def _initial_status(self, t: ResourceType, obj: Obj) -> Obj:
        if t.kind == "Pod" and t.group == "":
            return {"status": {"phase": "Pending"}}
        if t.kind == "Namespace":
            return {"status": {"phase": "Active"}}
        if t.kind == "CustomResourceDefinition":
            spec = obj.get("spec", {})
            conditions = [{"type": c, "status": "True", "reason": r, "message": m, "lastTransitionTime": now()}
                          for c, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                          ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]
            stored = [v["name"] for v in spec.get("versions", []) if v.get("storage")]
            return {"status": {"conditions": conditions, "acceptedNames": spec.get("names", {}), "storedVersions": stored}}
        return {}

    def _register_crd(self, crd: Obj) -> None:
        self._unregister_crd(crd)
        for t in crd_types(crd):
            self.types[(t.group, t.version, t.plural)] = t

    def _unregister_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        for key in [k for k in self.types if (k[0], k[2]) == (spec["group"], spec["names"]["plural"])]:
            del self.types[key]

    def replace(self, t: ResourceType, namespace: str | None, name: str, body: Obj, subresource: str = "") -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        old = self._stored(t, namespace, name)
        if (body.get("metadata") or {}).get("name", name) != name:
            raise errors.bad_request("the name of the object does not match the name on the URL")
        return self._update(t, old, copy.deepcopy(body), subresource)

    def patch(self, t: ResourceType, namespace: str | None, name: str, apply: Callable[[Obj], Obj], subresource: str = "") -> Obj:
        old = self._stored(t, namespace, name)
        return self._update(t, old, apply(self._out(t, old)), subresource)

    def _update(self, t: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        name = old_meta["name"]
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise errors.conflict(t.qualified, name)
        if subresource == "status":
            status = new.get("status")
            new = {k: v for k, v in copy.deepcopy(old).items() if k != "status"}
            if status is not None:
                new["status"] = status
        elif subresource:
            raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({t.plural}/{subresource})")
        elif "status" in t.subresources:
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        meta = new.setdefault("metadata", {})
        for kept in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise errors.invalid(t.kind, t.group, name, [("metadata.finalizers", f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)}")])
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        new["apiVersion"], new["kind"] = old.get("apiVersion", t.api_version), t.kind
        new = self.validate(t, _normalized(t, new), old)
        meta = new["metadata"]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == {**old, "apiVersion": new["apiVersion"], "kind": t.kind}:
            return self._out(t, old)  # a no-op write keeps the resourceVersion, like the API server
        if _spec_part(t, new) != _spec_part(t, old):
            meta["generation"] = old_meta.get("generation", 1) + 1
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(t, new)
        self._bucket(t)[self._index(t, new)] = new
        self._emit(t, "MODIFIED", new, old)
        if t.kind == "CustomResourceDefinition":
            self._register_crd(new)
        return self._out(t, new)

    @staticmethod
    def _index(t: ResourceType, obj: Obj) -> tuple[str, str]:
        return (obj["metadata"].get("namespace", "") if t.namespaced else "", obj["metadata"]["name"])

    def delete(self, t: ResourceType, namespace: str | None, name: str, options: Obj | None = None) -> Obj:
        obj = self._stored(t, namespace, name)
        options = options or {}
        uid = (options.get("preconditions") or {}).get("uid")
        if uid and uid != obj["metadata"]["uid"]:
            raise errors.conflict(t.qualified, name)
        orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
        if obj["metadata"].get("finalizers"):
            if obj["metadata"].get("deletionTimestamp"):
                return self._out(t, obj)
            old = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta.update(deletionTimestamp=now(), deletionGracePeriodSeconds=0,
                        generation=meta.get("generation", 1) + 1, resourceVersion=self._next_rv())
            self._emit(t, "MODIFIED", obj, old)
            return self._out(t, obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        return self._remove(t, obj, orphan=orphan)

    def _remove(self, t: ResourceType, obj: Obj, *, orphan: bool = False) -> Obj:
        self._bucket(t).pop(self._index(t, obj), None)
        self._emit(t, "DELETED", obj)
        if t.kind == "CustomResourceDefinition":
            self._drop_custom_resources(obj)
        if t.kind == "Namespace" and t.group == "":
            self._drop_namespace(obj["metadata"]["name"])
        asyncio.get_running_loop().call_soon(self._collect_garbage, obj["metadata"]["uid"], orphan)
        return self._out(t, obj)

    def _drop_custom_resources(self, crd: Obj) -> None:
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        served = next((t for t in self.types.values() if (t.group, t.plural) == key), None)
        if served is not None:
            for obj in list(self._bucket(served).values()):
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._remove(served, obj)
        self._unregister_crd(crd)

    def _drop_namespace(self, namespace: str) -> None:
        """Namespace deletion removes its content at once (finalizers of the content are bypassed)."""
        for t in self._storage_types():
            if t.namespaced:
                for (ns, _), obj in list(self._bucket(t).items()):
                    if ns == namespace:
                        obj["metadata"]["resourceVersion"] = self._next_rv()
                        self._remove(t, obj)

    def _storage_types(self) -> list[ResourceType]:
        """One type per storage (group, plural)."""
        seen: dict[Key, ResourceType] = {}
        for t in self.types.values():
            seen.setdefault((t.group, t.plural), t)
        return list(seen.values())

    def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        """Background cascade: dependents whose last owner is gone are deleted; with Orphan (or
        while other owners remain) only the dangling owner reference is removed."""
        for t in self._storage_types():
            for obj in list(self._bucket(t).values()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                remaining = [r for r in refs if r.get("uid") != owner_uid]
                if remaining or orphan:
                    self.patch(t, obj["metadata"].get("namespace"), obj["metadata"]["name"],
                               lambda o, remaining=remaining: {**o, "metadata": {**o["metadata"], "ownerReferences": remaining}})
                else:
                    self.delete(t, obj["metadata"].get("namespace"), obj["metadata"]["name"])

    # -- watch ---------------------------------------------------------------------------------
    def oldest_rv(self) -> int:
        """The oldest resourceVersion a watch can still resume from."""
        return (self.history[0].rv if self.history else self.rv + 1) - 1

    def bookmark(self, t: ResourceType, initial_events_end: bool = False) -> dict[str, Any]:
        """A BOOKMARK event: the watcher has seen everything up to the current resourceVersion."""
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": t.kind, "apiVersion": t.api_version, "metadata": meta}}

    def watch(self, t: ResourceType, namespace: str | None, matches: Predicate, resource_version: str | None,
              send_initial_events: bool = False) -> Watcher:
        """Register a watcher, pre-filled with what it must see first (current objects, ended by a
        bookmark when `send_initial_events`, or the history after `resource_version`); raise
        410 Gone when that history was dropped."""
        watcher = Watcher((t.group, t.plural), namespace, matches)
        if resource_version in (None, "", "0"):
            items, _ = self.list(t, namespace, matches)
            for item in items:
                watcher.queue.put_nowait({"type": "ADDED", "object": item})
            if send_initial_events:
                watcher.queue.put_nowait(self.bookmark(t, initial_events_end=True))
        else:
            try:
                since = int(resource_version)
            except ValueError as e:
                raise errors.bad_request(f"invalid resourceVersion {resource_version!r}") from e
            if since < self.oldest_rv():
                raise errors.ApiError(410, "Expired", f"too old resource version: {since} ({self.oldest_rv()})")
            for event in self.history:
                if event.rv > since:
                    watcher.offer(event)
        self.watchers.add(watcher)
        return watcher
