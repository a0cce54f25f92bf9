"""What ships: `helm package` carries the CRD as a real file, identical to crds/; the rendered
chart is valid Kubernetes objects; helm lint passes."""

from __future__ import annotations

import re
import shlex
import subprocess
import tarfile
from pathlib import Path

import kubernetes_validate
import yaml

from tests.chart.conftest import CHART, REPO, render

CRD = "profilesession.yaml"


def test_the_chart_holds_the_crd_as_a_real_file() -> None:
    """Renderer-free: a symlink in the chart would be lost by tools that copy the chart directory
    without following links; crds/ links to the chart's file instead."""
    assert not (CHART / "crds" / CRD).is_symlink()
    assert (REPO / "crds" / CRD).resolve() == (CHART / "crds" / CRD).resolve()


def test_helm_package_carries_the_crd(helm: str, tmp_path: Path) -> None:
    subprocess.run([helm, "package", str(CHART), "--destination", str(tmp_path)], check=True, capture_output=True)
    [package] = tmp_path.glob("stepscope-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.getmember(f"stepscope/crds/{CRD}")
        assert member.isfile()
        assert tar.extractfile(member).read() == (REPO / "crds" / CRD).read_bytes()


def test_helm_lint(helm: str) -> None:
    result = subprocess.run([helm, "lint", str(CHART), "--strict"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_chart_is_valid_kubernetes_objects(helm: str) -> None:
    docs = render(helm, "operator.namespaces={team-a,team-b}")
    assert {d["kind"] for d in docs} >= {
        "Deployment",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "Service",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
    }
    shipped_kinds = {yaml.safe_load(f.read_text())["spec"]["names"]["kind"] for f in (CHART / "crds").glob("*.yaml")}
    for doc in docs:
        if doc["apiVersion"].split("/")[0].endswith((".dev", "stepscope.io")):
            assert doc["kind"] in shipped_kinds, f"{doc['kind']}: the chart renders it but does not ship its CRD"
        else:
            kubernetes_validate.validate(doc, "1.33", strict=True)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--namespace=team-a" in command and "--namespace=team-b" in command


def _readme_helm_install() -> list[str]:
    text = (REPO / "README.md").read_text()
    command = re.search(r"^helm install stepscope helm/stepscope .*?(?<!\\)$", text, re.S | re.M)
    assert command, "README has no `helm install` command"
    return shlex.split(command.group(0).replace("\\\n", " "))


def test_the_readme_install_command_renders(helm: str) -> None:
    args = _readme_helm_install()
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    docs = render(helm, *sets)
    assert any(d["kind"] == "Role" and d["metadata"]["namespace"] == "training" for d in docs)


def test_the_readme_table_has_the_crd_columns() -> None:
    """kubectl prints printer column names upper-cased, after NAME."""
    crd = yaml.safe_load((REPO / "crds" / CRD).read_text())
    columns = ["NAME"] + [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    header = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("# NAME "))
    assert re.split(r"\s{2,}", header.removeprefix("# ").strip()) == columns


def test_the_readme_upgrades_and_uninstalls_every_crd_and_what_the_operator_leaves(helm: str) -> None:
    """Helm never upgrades or deletes a chart's CRDs, and the operator creates Secrets Helm does not
    know: the README's commands must name them all, so that neither an upgrade nor an uninstall
    leaves a CRD or a key behind."""
    text = (REPO / "README.md").read_text()
    crd_folder = "helm/stepscope/crds/"
    assert sorted(p.name for p in (REPO / crd_folder).glob("*.yaml")) == [
        "kopfpeering.yaml",
        "profilesession.yaml",
        "profiletrigger.yaml",
    ]
    assert f"kubectl apply --server-side -f {crd_folder}" in text
    assert f"kubectl delete -f {crd_folder}" in text
    docs = render(helm)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env") or []}
    created = {v for k, v in env.items() if k.endswith("_SECRET") and v}
    assert len(created) >= 2, f"the Secrets the operator creates are no longer found in its env: {env}"
    deletes = re.search(r"^kubectl -n stepscope delete secret (.+)$", text, re.M)
    assert deletes and created <= set(deletes.group(1).split())
    # Each kind that carries the operator's finalizer gets it removed when the operator is gone.
    assert re.search(r"for kind in profilesessions profiletriggers; do", text)
