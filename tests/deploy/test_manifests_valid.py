"""Every rendered manifest validates against Kubernetes' own schemas, strict (no unknown fields), for 1.30 and
the newest version kubernetes-validate ships."""
from __future__ import annotations

import kubernetes_validate
import pytest

from tests.deploy.render import CASES, FULLNAME, render_docs, strip

VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD_GROUPS = ("monitoring.coreos.com/",)  # ServiceMonitor, PodMonitor, PrometheusRule: CRDs, no schema in Kubernetes
# itself; tests/deploy/test_chart_monitoring.py checks their shape


def test_the_newest_schema_is_newer_than_1_30():
    assert tuple(int(x) for x in VERSIONS[1].split(".")[:2]) > (1, 30)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_manifests_validate_strictly(chart, case, version):
    docs = render_docs(chart, CASES[case])
    checked = 0
    for doc in docs:
        obj = strip(doc)
        if obj["apiVersion"].startswith(CRD_GROUPS):
            assert obj["metadata"]["name"].startswith(FULLNAME)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{case}: {obj['kind']}/{obj['metadata']['name']} ({doc['__template__']}) is not valid "
                        f"Kubernetes {version}: {path}: {e.message}")
        checked += 1
    assert checked >= 10


def test_validation_catches_an_unknown_field(chart):
    """The strict check is not vacuous: a misspelt field in a rendered Deployment fails it."""
    docs = render_docs(chart, {})
    deployment = strip(next(d for d in docs if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
