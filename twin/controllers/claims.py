"""The resourceclaim controller (kube-controller-manager's, for structured parameters).

- For each pod entry `spec.resourceClaims[] {name, resourceClaimTemplateName}` not yet in
  `pod.status.resourceClaimStatuses`, create a ResourceClaim from the template: generateName
  `<pod>-<entry>-` (random suffix), ownerReference to the pod (controller),
  annotation `resource.kubernetes.io/pod-claim-name: <entry>`; then record
  `{name, resourceClaimName}` in the pod's status (tests/k8s_golden/32 and 33).
- Keep `status.reservedFor` honest: drop pods that are gone (uid changed) or finished.
- A claim reserved by nobody is deallocated, and its `delete-protection` finalizer removed,
  so a claim being deleted goes away; a generated claim of a finished pod is deleted. While
  a pod is only Terminating it still reserves its claim: the device stays allocated until the
  kubelet stand-in finishes the pod (golden 37 and 45).
"""

from __future__ import annotations

import logging
from typing import Any

from twin.controllers.common import (
    CLAIM_FINALIZER,
    CLAIM_TEMPLATES,
    CLAIMS,
    POD_CLAIM_NAME_ANN,
    PODS,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    uid_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

MANAGER = "kube-controller-manager"


class ResourceClaimController:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._reported: set[tuple[str, str]] = set()  # (pod uid, claim entry) warned about

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        if not ctx.dra:
            return None
        pods = store.list(PODS, copy_objects=False).items
        claims = store.list(CLAIMS, copy_objects=False).items
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for claim in claims:
            for ref in meta(claim).get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid", ""), []).append(claim)
        for pod in pods:
            if pod["spec"].get("resourceClaims") and not is_terminal(pod) and not is_deleting(pod):
                self._ensure_claims(store, pod, by_owner.get(uid_of(pod), []))
        live = {(ns_of(p), name_of(p)): p for p in pods}
        for claim in claims:
            self._reconcile_claim(store, claim, live)
        return None

    # -- template claims -----------------------------------------------------------------

    def _ensure_claims(self, store: Any, pod: dict[str, Any], owned: list[dict[str, Any]]) -> None:
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s.get("name") for s in statuses}
        added: list[dict[str, Any]] = []
        for entry in pod["spec"]["resourceClaims"]:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name or entry.get("name") in known:
                continue
            existing = next(
                (
                    c
                    for c in owned
                    if (meta(c).get("annotations") or {}).get(POD_CLAIM_NAME_ANN) == entry["name"]
                ),
                None,
            )
            if existing is None:
                existing = self._create_claim(store, pod, entry, template_name)
            if existing is not None:
                added.append({"name": entry["name"], "resourceClaimName": name_of(existing)})
        if not added:
            return

        def record(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            current = status.setdefault("resourceClaimStatuses", [])
            names = {s.get("name") for s in current}
            current.extend(a for a in added if a["name"] not in names)

        try:
            store.mutate(PODS, name_of(pod), record, ns_of(pod), subresource="status")
        except ApiError as err:
            log.debug("pod %s/%s claim status: %s", ns_of(pod), name_of(pod), err.message)

    def _create_claim(
        self, store: Any, pod: dict[str, Any], entry: dict[str, Any], template_name: str
    ) -> dict[str, Any] | None:
        template = store.try_get(CLAIM_TEMPLATES, template_name, ns_of(pod))
        if template is None:
            # Retried on every pass; the pod stays Pending. Say why, once per pod and entry.
            key = (uid_of(pod), str(entry["name"]))
            if key not in self._reported:
                self._reported.add(key)
                self.manager.events.controller(
                    pod,
                    "resource_claim",
                    "FailedResourceClaimCreation",
                    f"PodResourceClaim {entry['name']}: resource claim template "
                    f'"{template_name}": resourceclaimtemplate.resource.k8s.io '
                    f'"{template_name}" not found',
                    etype="Warning",
                )
            return None
        tspec = template.get("spec") or {}
        tmeta = tspec.get("metadata") or {}
        claim: dict[str, Any] = {
            "metadata": {
                "generateName": f"{name_of(pod)}-{entry['name']}-",
                "namespace": ns_of(pod),
                "annotations": {
                    **(tmeta.get("annotations") or {}),
                    POD_CLAIM_NAME_ANN: entry["name"],
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": name_of(pod),
                        "uid": uid_of(pod),
                        "controller": True,  # no blockOwnerDeletion, as in golden 32
                    }
                ],
            },
            "spec": tspec.get("spec") or {},
        }
        if tmeta.get("labels"):
            claim["metadata"]["labels"] = dict(tmeta["labels"])
        try:
            return store.create(CLAIMS, claim, namespace=ns_of(pod), manager=MANAGER)
        except ApiError as err:
            log.warning(
                "claim for pod %s/%s not created: %s", ns_of(pod), name_of(pod), err.message
            )
            return None

    # -- reservations, deallocation, deletion --------------------------------------------

    def _reconcile_claim(
        self, store: Any, claim: dict[str, Any], live: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        status = claim.get("status") or {}
        reserved = list(status.get("reservedFor") or [])
        keep = []
        for ref in reserved:
            pod = live.get((ns_of(claim), ref.get("name", "")))
            if ref.get("resource", "pods") != "pods":
                keep.append(ref)  # another kind of consumer: not ours to judge
            elif pod is not None and uid_of(pod) == ref.get("uid") and not is_terminal(pod):
                keep.append(ref)
        owner_pod = self._owner_pod(claim, live)
        generated = POD_CLAIM_NAME_ANN in (meta(claim).get("annotations") or {})
        if (
            generated
            and owner_pod is not None
            and is_terminal(owner_pod)
            and not is_deleting(claim)
        ):
            try:
                store.delete(CLAIMS, name_of(claim), ns_of(claim))
            except ApiError:
                pass
            return
        allocated = bool(status.get("allocation"))
        if keep != reserved or (not keep and allocated):

            def release(obj: dict[str, Any]) -> None:
                st = obj.setdefault("status", {})
                if keep:
                    st["reservedFor"] = keep
                else:
                    st.pop("reservedFor", None)
                    st.pop("allocation", None)
                    st.pop("devices", None)

            try:
                store.mutate(CLAIMS, name_of(claim), release, ns_of(claim), subresource="status")
            except ApiError:
                return
            allocated = bool(keep) and allocated
        finalizers = meta(claim).get("finalizers") or []
        if CLAIM_FINALIZER in finalizers and not allocated and not keep:

            def unprotect(obj: dict[str, Any]) -> None:
                obj["metadata"]["finalizers"] = [
                    f for f in obj["metadata"].get("finalizers") or [] if f != CLAIM_FINALIZER
                ]
                if not obj["metadata"]["finalizers"]:
                    del obj["metadata"]["finalizers"]

            try:
                store.mutate(CLAIMS, name_of(claim), unprotect, ns_of(claim))
            except ApiError:
                pass

    @staticmethod
    def _owner_pod(
        claim: dict[str, Any], live: dict[tuple[str, str], dict[str, Any]]
    ) -> dict[str, Any] | None:
        for ref in meta(claim).get("ownerReferences") or []:
            if ref.get("kind") == "Pod":
                pod = live.get((ns_of(claim), ref.get("name", "")))
                if pod is not None and uid_of(pod) == ref.get("uid"):
                    return pod
        return None
