"""The Helm chart renders for every example and edge case, lints clean, and its manifests say what they must."""
from __future__ import annotations

import helm_python as helm
import pytest

from tests.deploy.render import CASES, CHART, FULLNAME, NAMESPACE, find, kinds, pod_spec, render_docs, values_file

@pytest.fixture(scope="module")
def rendered(chart):
    return {case: render_docs(chart, values) for case, values in CASES.items()}


def args_of(container: dict) -> dict[str, str]:
    """`--flag=value` args as {flag: value}."""
    return dict(a[2:].split("=", 1) for a in container["args"] if a.startswith("--"))


@pytest.mark.parametrize("values_name", ["values.yaml", "values-cpu-local.yaml", "values-gpu.yaml"])
def test_lint_is_clean_in_strict_mode(values_name):
    values = None if values_name == "values.yaml" else values_file(values_name)
    report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0", namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 = info ("icon is recommended")
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_name_goes_through_fullname(rendered, case):
    for doc in rendered[case]:
        name = doc["metadata"]["name"]
        assert name.startswith(FULLNAME + "-") or name == FULLNAME, f"{doc['kind']}/{name} not under {FULLNAME}"
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "demo" and labels["app.kubernetes.io/name"] == "ssd"
        assert labels["app.kubernetes.io/component"]


def test_fullname_override_renames_everything(chart):
    docs = render_docs(chart, {"fullnameOverride": "llm", "redis": {"enabled": True}})
    assert all(d["metadata"]["name"].startswith("llm") for d in docs)
    router = find(docs, "Deployment", "llm-router")
    args = args_of(pod_spec(router)["containers"][0])
    assert args["k8s-target-service"] == "llm-target" and args["k8s-draft-service"] == "llm-draft"
    assert args["state-redis-url"] == "redis://llm-redis:6379/0"


def test_release_named_like_the_chart_is_not_doubled(chart):
    docs = render_docs(chart, {}, name="ssd")
    assert ("Deployment", "ssd-router") in kinds(docs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_ssd_container_has_grpc_health_probes_on_its_own_port(rendered, case):
    for doc in rendered[case]:
        if doc["kind"] not in ("Deployment", "StatefulSet") or doc["metadata"]["labels"]["app.kubernetes.io/component"] == "redis":
            continue
        spec = pod_spec(doc)
        (container,) = spec["containers"]
        health_port = next(p["containerPort"] for p in container["ports"] if p["name"] in ("grpc", "control"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": health_port}, (doc["metadata"]["name"], probe)
        assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
        assert spec["terminationGracePeriodSeconds"] > int(container["lifecycle"]["preStop"]["exec"]["command"][1])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("case", ["defaults", "gpu", "router-replicas-3"])
def test_hpa_scales_the_draft_deployment_on_late_entries_and_cpu(rendered, case):
    docs = rendered[case]
    hpa = find(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-draft")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    draft = find(docs, "Deployment", ref["name"])
    assert ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{FULLNAME}-draft"}
    assert draft["metadata"]["labels"]["app.kubernetes.io/component"] == "draft"
    assert "replicas" not in draft["spec"], "the HPA owns the replica count"
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    external = metrics["External"]["external"]
    assert external["metric"]["name"] == "ssd_late_entry_ratio"
    assert external["metric"]["selector"]["matchLabels"] == {"service": f"{FULLNAME}-router"}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert draft["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]


def test_gpu_example_cuda_bf16_gpus_and_draft_range(rendered):
    """Target and drafts on one GPU each, in bf16 on CUDA (the workers refuse TP ranks on CUDA in this build)."""
    docs = rendered["gpu"]
    target = pod_spec(find(docs, "StatefulSet", f"{FULLNAME}-target"))["containers"][0]
    assert args_of(target)["tp-size"] == "1"
    assert target["resources"]["limits"]["nvidia.com/gpu"] == 1 == target["resources"]["requests"]["nvidia.com/gpu"]
    assert args_of(target)["model"] == "/models/Qwen3-32B"
    draft = pod_spec(find(docs, "Deployment", f"{FULLNAME}-draft"))["containers"][0]
    assert draft["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert args_of(draft)["model"] == "/models/Qwen3-0.6B"
    for container in (target, draft):
        assert (args_of(container)["device"], args_of(container)["dtype"]) == ("cuda", "bfloat16")
    hpa = find(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-draft")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    models = next(v for v in pod_spec(find(docs, "StatefulSet", f"{FULLNAME}-target"))["volumes"] if v["name"] == "models")
    assert models["persistentVolumeClaim"] == {"claimName": "ssd-models", "readOnly": True}
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))["containers"][0]
    assert args_of(router)["state-redis-url"] == f"redis://{FULLNAME}-redis:6379/0"
    assert args_of(router)["api-keys-file"] == "/etc/ssd/api-keys/api-keys"


def _ports(doc) -> set[int]:
    return {p["port"] for rule in doc["spec"]["ingress"] for p in rule["ports"]}


def _service_ports(doc) -> set[int]:
    return {p["port"] for p in doc["spec"]["ports"]}


@pytest.mark.parametrize("values", [{}, {"router": {"ports": {"grpc": 9000, "http": 9080}},
                                         "target": {"ports": {"data": 7001, "control": 7002}},
                                         "draft": {"ports": {"data": 7101, "control": 7102}},
                                         "redis": {"enabled": True, "ports": {"redis": 7379}}}])
def test_network_policy_ports_are_the_services_ports(chart, values):
    docs = render_docs(chart, values)
    for component in ("router", "target", "draft") + (("redis",) if values else ()):
        name = f"{FULLNAME}-{component}"
        policy, service = find(docs, "NetworkPolicy", name), find(docs, "Service", name)
        assert _ports(policy) == _service_ports(service), component
        workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name)
        container_ports = {p["containerPort"] for p in pod_spec(workload)["containers"][0]["ports"]}
        assert container_ports == _service_ports(service), component
        if component != "router":  # only the router reaches the data plane (and Redis)
            (rule,) = policy["spec"]["ingress"]
            assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]] == ["router"]
    # ... and the ports the services bind and the router dials are those same values
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))["containers"][0]
    args = args_of(router)
    router_ports = _service_ports(find(docs, "Service", f"{FULLNAME}-router"))
    assert {int(args["grpc-address"].rsplit(":", 1)[1]), int(args["http-address"].rsplit(":", 1)[1])} == router_ports
    for role in ("target", "draft"):
        worker = next(d for d in docs if d["metadata"]["name"] == f"{FULLNAME}-{role}" and d["kind"] != "Service"
                      and "template" in d["spec"])
        wargs = args_of(pod_spec(worker)["containers"][0])
        bound = {int(wargs["data-address"].rsplit(":", 1)[1]), int(wargs["control-address"].rsplit(":", 1)[1])}
        assert bound == _service_ports(find(docs, "Service", f"{FULLNAME}-{role}"))
        assert int(args[f"k8s-{role}-port"]) == int(wargs["data-address"].rsplit(":", 1)[1])
        assert args[f"k8s-{role}-service"] == f"{FULLNAME}-{role}"
        assert find(docs, "Service", f"{FULLNAME}-{role}")["spec"]["clusterIP"] == "None"


def test_router_policy_lets_clients_and_the_test_pod_in(rendered):
    policy = find(rendered["everything-on"], "NetworkPolicy", f"{FULLNAME}-router")
    (rule,) = policy["spec"]["ingress"]
    assert {"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}} in rule["from"]
    test_pod = find(rendered["everything-on"], "Pod", f"{FULLNAME}-test-generate")
    test_labels = test_pod["metadata"]["labels"]
    pod_peers = [peer["podSelector"]["matchLabels"] for peer in rule["from"] if "podSelector" in peer]
    assert any(labels.items() <= test_labels.items() for labels in pod_peers)
    assert "from" not in find(rendered["defaults"], "NetworkPolicy", f"{FULLNAME}-router")["spec"]["ingress"][0]


def test_rbac_lets_the_router_watch_endpointslices(rendered):
    docs = rendered["defaults"]
    role = find(docs, "Role", f"{FULLNAME}-router")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    binding = find(docs, "RoleBinding", f"{FULLNAME}-router")
    sa = find(docs, "ServiceAccount", FULLNAME)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))
    assert router["serviceAccountName"] == FULLNAME and router["automountServiceAccountToken"] is True
    assert args_of(router["containers"][0])["k8s-namespace"] == NAMESPACE
    assert pod_spec(find(docs, "StatefulSet", f"{FULLNAME}-target"))["automountServiceAccountToken"] is False


def test_pdbs_select_each_component(rendered):
    docs = rendered["defaults"]
    for component in ("router", "target", "draft"):
        pdb = find(docs, "PodDisruptionBudget", f"{FULLNAME}-{component}")
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component


def test_drafts_disabled_renders_no_draft_objects(rendered):
    docs = rendered["drafts-disabled"]
    assert not [d for d in docs if d["metadata"]["name"] == f"{FULLNAME}-draft"]
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))["containers"][0]
    assert args_of(router)["mode"] == "ar"


def test_external_redis_is_used_and_none_installed(rendered):
    docs = rendered["redis-external"]
    assert not [d for d in docs if d["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"]
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))["containers"][0]
    assert args_of(router)["state-redis-url"] == "redis://redis.shared.svc:6379/2"


def test_autoscaling_off_uses_replica_count(rendered):
    docs = rendered["autoscaling-off"]
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert find(docs, "Deployment", f"{FULLNAME}-draft")["spec"]["replicas"] == 3


def test_router_replicas_3_with_redis(rendered):
    docs = rendered["router-replicas-3"]
    assert find(docs, "Deployment", f"{FULLNAME}-router")["spec"]["replicas"] == 3
    redis = find(docs, "Service", f"{FULLNAME}-redis")
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))["containers"][0]
    assert args_of(router)["state-redis-url"] == f"redis://{redis['metadata']['name']}:6379/0"
    policy = find(docs, "NetworkPolicy", f"{FULLNAME}-redis")
    assert _ports(policy) == {6379}


def test_api_keys_come_from_a_secret(rendered):
    docs = rendered["everything-on"]
    secret = find(docs, "Secret", f"{FULLNAME}-api-keys")
    assert secret["stringData"]["api-keys"].split() == ["k1", "k2"]
    router = pod_spec(find(docs, "Deployment", f"{FULLNAME}-router"))
    volume = next(v for v in router["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert args_of(router["containers"][0])["api-keys-file"] == "/etc/ssd/api-keys/api-keys"
    test_env = {e["name"]: e for e in find(docs, "Pod", f"{FULLNAME}-test-generate")["spec"]["containers"][0]["env"]}
    assert test_env["SSD_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    ingress = find(docs, "Ingress", f"{FULLNAME}-router")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{FULLNAME}-router", "port": {"name": "http"}}
    monitor = find(docs, "ServiceMonitor", f"{FULLNAME}-router")
    assert monitor["spec"]["endpoints"][0]["port"] == "http" and monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_prepare_init_container_builds_the_default_models(rendered):
    for case in ("cpu-local", "everything-on"):
        for doc in rendered[case]:
            if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] != f"{FULLNAME}-redis":
                (init,) = pod_spec(doc)["initContainers"]
                assert init["args"] == ["models", "prepare", "--models-dir=/models"]
    assert not any("initContainers" in pod_spec(d) for d in rendered["gpu"] if d["kind"] in ("Deployment", "StatefulSet"))


def test_helm_test_pod_runs_a_generation_through_the_sdk(rendered):
    pod = find(rendered["defaults"], "Pod", f"{FULLNAME}-test-generate")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    script = container["args"][0]
    compile(script, "helm-test", "exec")
    assert "from ssd.client import Client" in script and ".generate(" in script
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SSD_ROUTER"] == f"{FULLNAME}-router:50051"
    assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("values, message", [
    ({"router": {"replicaCount": 3}},
     "router.replicaCount=3 needs Redis request state so a stream can resume on another router: "
     "set redis.enabled=true or redis.externalUrl"),
    ({"draft": {"enabled": False}}, "router.mode=ssd needs draft replicas: set draft.enabled=true, or router.mode=ar"),
    ({"redis": {"enabled": True, "externalUrl": "redis://x:6379/0"}}, "set either redis.enabled=true"),
    ({"router": {"apiKeys": {"enabled": True}}}, "router.apiKeys.enabled needs router.apiKeys.existingSecret"),
    ({"draft": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas (5) is above maxReplicas (2)"),
    ({"models": {"volume": {"type": "persistentVolumeClaim"}}}, "needs models.volume.claimName"),
    ({"router": {"discovery": "redis"}}, "router.discovery=redis needs Redis"),
])
def test_impossible_settings_fail_with_a_clear_message(chart, values, message):
    with pytest.raises(helm.HelmRenderError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        render_docs(chart, values)


@pytest.mark.parametrize("values, where", [
    ({"router": {"replicaCount": "three"}}, "/router/replicaCount"),
    ({"draft": {"autoscaling": {"maxReplicas": "8"}}}, "/draft/autoscaling/maxReplicas"),
    ({"target": {"tensorParallelSize": 0}}, "/target/tensorParallelSize"),
    ({"router": {"mode": "fast"}}, "/router/mode"),
    ({"router": {"replicas": 2}}, "replicas"),
    ({"target": {"ports": {"data": 70000}}}, "/target/ports/data"),
    ({"redis": {"persistence": {"appendfsync": "never"}}}, "/redis/persistence/appendfsync"),
])
def test_schema_rejects_wrong_values(chart, values, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render_docs(chart, values)


def test_in_chart_redis_keeps_request_state_on_disk(chart):
    def redis(values):
        doc = find(render_docs(chart, {"redis": {"enabled": True, **values}}), "Deployment", f"{FULLNAME}-redis")
        spec = pod_spec(doc)
        return spec["containers"][0]["args"], spec["volumes"][0]

    args, volume = redis({})
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--appendfsync") + 1] == "always"
    assert volume == {"name": "data", "emptyDir": {}}
    args, volume = redis({"persistence": {"existingClaim": "ssd-redis-data", "appendfsync": "everysec"}})
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert volume["persistentVolumeClaim"] == {"claimName": "ssd-redis-data"}
    args, _ = redis({"persistence": {"enabled": False}})
    assert args[args.index("--appendonly") + 1] == "no" and "--appendfsync" not in args


def test_curve_keys_are_mounted_and_passed_to_every_service(chart):
    docs = render_docs(chart, {"dataPlane": {"curve": {"enabled": True, "existingSecret": "ssd-curve"}}})
    seen = set()
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet") or doc["metadata"]["name"].endswith("-redis"):
            continue
        spec = pod_spec(doc)
        container = spec["containers"][0]
        args = args_of(container)
        role = container["args"][0]
        assert {"name": "curve-keys", "secret": {"secretName": "ssd-curve", "defaultMode": 0o440}} in spec["volumes"]
        assert {"name": "curve-keys", "mountPath": "/etc/ssd/curve", "readOnly": True} in container["volumeMounts"]
        if role == "router":
            assert args["curve-secret-key-file"] == "/etc/ssd/curve/router.key_secret"
            assert args["curve-worker-key"] == "/etc/ssd/curve/worker.key"
        else:
            assert args["curve-secret-key-file"] == "/etc/ssd/curve/worker.key_secret"
            assert args["curve-authorized-keys"] == "/etc/ssd/curve/router.key"
        seen.add(role)
    assert seen == {"router", "target", "draft"}
    with pytest.raises(helm.HelmRenderError, match="dataPlane.curve.existingSecret"):
        render_docs(chart, {"dataPlane": {"curve": {"enabled": True}}})
    assert not any("curve" in str(d) for d in render_docs(chart, {}))
