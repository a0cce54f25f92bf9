"""Pod Security admission for namespaces labelled `pod-security.kubernetes.io/enforce`, as the API
server's PodSecurity plugin checks a new pod (Pod Security Standards, "latest" version; reasons
worded like k8s.io/pod-security-admission's).

Checked, baseline: host namespaces, privileged containers, added capabilities outside the baseline
set, hostPath volumes, host ports, seccomp Unconfined. Restricted adds: volume types,
allowPrivilegeEscalation=false, runAsNonRoot=true (pod or every container), no runAsUser=0,
seccompProfile RuntimeDefault/Localhost (pod or every container), capabilities drop ALL and add
only NET_BIND_SERVICE. Every container kind counts (containers, initContainers, ephemeral).
Not checked: AppArmor, SELinux options, /proc mount type, sysctls, Windows host process, and
the `warn`/`audit` modes and exemptions."""
from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret", "image"}


def _names(kind: str, names: list[str]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"{kind} {quoted}" if len(names) == 1 else f"{kind}s {quoted}"


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or [])]


def _baseline(spec: dict[str, Any]) -> list[str]:
    out = []
    containers = _containers(spec)
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        out.append(f"host namespaces ({', '.join(host)})")
    privileged = [c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        out.append(f"privileged ({_names('container', privileged)} must not set securityContext.privileged=true)")
    added = [c["name"] for c in containers if set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES]
    if added:
        out.append(f"non-default capabilities ({_names('container', added)} must not include capabilities outside the baseline set)")
    host_path = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_path:
        out.append(f"hostPath volumes ({_names('volume', host_path)})")
    ports = [c["name"] for c in containers if any(p.get("hostPort") for p in c.get("ports") or [])]
    if ports:
        out.append(f"hostPort ({_names('container', ports)} uses hostPorts)")
    unconfined = [c["name"] for c in containers if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined" or unconfined:
        out.append("seccompProfile (pod or containers must not set securityContext.seccompProfile.type to \"Unconfined\")")
    return out


def _restricted(spec: dict[str, Any]) -> list[str]:
    out = []
    pod_ctx = spec.get("securityContext") or {}
    containers = _containers(spec)
    ctx = {c["name"]: c.get("securityContext") or {} for c in containers}
    bad_volumes = [v["name"] for v in spec.get("volumes") or [] if not (set(v) - {"name"}) <= RESTRICTED_VOLUMES]
    if bad_volumes:
        out.append(f"restricted volume types ({_names('volume', bad_volumes)} use a restricted volume type)")
    escalation = [n for n, c in ctx.items() if c.get("allowPrivilegeEscalation") is not False]
    if escalation:
        out.append(f"allowPrivilegeEscalation != false ({_names('container', escalation)} must set securityContext.allowPrivilegeEscalation=false)")
    caps = [n for n, c in ctx.items() if "ALL" not in ((c.get("capabilities") or {}).get("drop") or [])
            or set((c.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}]
    if caps:
        out.append(f"unrestricted capabilities ({_names('container', caps)} must set securityContext.capabilities.drop=[\"ALL\"] and add only NET_BIND_SERVICE)")
    non_root = [n for n, c in ctx.items() if c.get("runAsNonRoot") is False or (c.get("runAsNonRoot") is None and pod_ctx.get("runAsNonRoot") is not True)]
    if pod_ctx.get("runAsNonRoot") is False or non_root:
        out.append(f"runAsNonRoot != true (pod or {_names('container', non_root)} must set securityContext.runAsNonRoot=true)")
    root = [n for n, c in ctx.items() if c.get("runAsUser") == 0]
    if pod_ctx.get("runAsUser") == 0 or root:
        out.append(f"runAsUser=0 (pod or {_names('container', root)} must not set runAsUser=0)")
    ok = ("RuntimeDefault", "Localhost")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    seccomp = [n for n, c in ctx.items() if ((c.get("seccompProfile") or {}).get("type") or (pod_seccomp if pod_seccomp in ok else None)) not in ok]
    if seccomp:
        out.append(f"seccompProfile (pod or {_names('container', seccomp)} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")")
    return out


def violations(pod: dict[str, Any], level: str) -> list[str]:
    """What keeps `pod` out of a namespace enforcing `level` (privileged, baseline, restricted)."""
    spec = pod.get("spec") or {}
    if level == "privileged":
        return []
    return _baseline(spec) + (_restricted(spec) if level == "restricted" else [])
