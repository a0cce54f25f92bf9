"""The CRDs are generated from stepscope.contracts: the committed files are what `make crds`
writes, and the parser the parts use refuses what the schema refuses."""
from __future__ import annotations

import pytest
import yaml

from stepscope import crds
from stepscope.contracts.openapi import CRDS
from stepscope.contracts.schema import Field, Record, SpecError
from stepscope.contracts.session import SessionSpec
from stepscope.testing.kube.fixtures import REPO

STORAGE = {"uri": "s3://bucket/p", "credentialsSecret": "store"}


@pytest.mark.parametrize("name", sorted(CRDS))
def test_committed_crds_are_generated_from_the_contracts(name: str) -> None:
    committed = (REPO / "helm" / "stepscope" / "crds" / name).read_text()
    assert committed == crds.render(name), f"helm/stepscope/crds/{name} is stale: run `make crds`"
    assert (REPO / "crds" / name).resolve() == REPO / "helm" / "stepscope" / "crds" / name


def _bounded(cls: type[Record], path: str) -> list[tuple[str, Field]]:
    found = []
    for f in cls.FIELDS:
        if f.record is not None:
            found += _bounded(f.record, f"{path}.{f.name}")
        elif f.kind in ("integer", "number") and "maximum" in f.bounds:
            found.append((f"{path}.{f.name}", f))
    return found


def _spec_with(path: str, value: object) -> dict:
    spec: dict = {"storage": dict(STORAGE)}
    *parents, leaf = path.split(".")[1:]
    node = spec
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return spec


@pytest.mark.parametrize(("path", "field"), _bounded(SessionSpec, "spec"), ids=lambda v: v if isinstance(v, str) else "")
def test_the_parser_refuses_what_the_schema_refuses(path: str, field: Field) -> None:
    """Every maximum of the CRD holds for a spec that reaches a part without the API server."""
    SessionSpec.from_dict(_spec_with(path, field.bounds["maximum"]))
    with pytest.raises(SpecError, match=path.replace(".", r"\.")):
        SessionSpec.from_dict(_spec_with(path, field.bounds["maximum"] + 1))


def test_a_sessions_comm_kernel_patterns_are_bounded_explained_and_checked(kube) -> None:
    """spec.analysis.commKernelPatterns, added in one place: the CRD bounds and explains it, the API
    server refuses too many or too long, and the parser a pattern that is no regular expression."""
    from kubernetes.client import ApiException, CustomObjectsApi

    from stepscope.contracts.session import GROUP, PLURAL, VERSION
    from stepscope.testing.kube.fixtures import CRD_PATH

    node = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = node["properties"]["spec"]["properties"]["analysis"]["properties"]["commKernelPatterns"]
    assert (field["maxItems"], field["items"]["maxLength"], field["default"]) == (16, 256, [])
    assert "regular expressions" in field["description"]
    kube.apply_crd()
    custom = CustomObjectsApi(kube.api_client)
    for patterns in (["x"] * 17, ["x" * 257]):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": "too-many"},
                "spec": {"selector": {"matchLabels": {"a": "b"}}, "storage": STORAGE, "analysis": {"commKernelPatterns": patterns}}}
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
        assert refused.value.status == 422 and "commKernelPatterns" in refused.value.body
    with pytest.raises(SpecError, match=r"spec\.analysis\.commKernelPatterns\[1\] is not a regular expression"):
        SessionSpec.from_dict({"storage": STORAGE, "analysis": {"commKernelPatterns": ["ok", "("]}})
