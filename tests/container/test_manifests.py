"""The Kubernetes manifests in container/, validated offline: the plain Deployment and Service against
Kubernetes' own schemas (kubernetes-validate, strict), the KServe InferenceService against KServe's
v1beta1 fields with its pod and containers checked by the same Kubernetes definitions."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "container" / "k8s-deployment.yaml"
INFERENCE_SERVICE = REPO / "container" / "kserve-inferenceservice.yaml"
KSERVE_SCHEMA = Path(__file__).parent / "fixtures" / "kserve-inferenceservice-v1beta1.schema.json"
K8S_VERSION = "1.30.0"
SERVE_PORT = 8080


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _k8s_definitions() -> dict:
    import importlib_resources
    import kubernetes_validate.utils as kv

    version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(K8S_VERSION)][-1]
    ref = importlib_resources.files("kubernetes_validate").joinpath(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json"
    )
    return json.loads(ref.read_text())


def _absolute_refs(node, base: str):  # type: ignore[no-untyped-def]
    """Copy of a definitions subtree whose local ``#/...`` references point into ``base``."""
    if isinstance(node, dict):
        return {
            k: (base + v if k == "$ref" and v.startswith("#") else _absolute_refs(v, base)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_absolute_refs(v, base) for v in node]
    return node


def _kserve_validator() -> jsonschema.Draft202012Validator:
    definitions = _k8s_definitions()
    schema = json.loads(KSERVE_SCHEMA.read_text())
    # the predictor inlines a PodSpec: its fields, checked by Kubernetes' strict definitions
    pod_spec = definitions["$defs"]["io.k8s.api.core.v1.PodSpec"]
    predictor = schema["$defs"]["PredictorSpec"]
    predictor["properties"].update(_absolute_refs(copy.deepcopy(pod_spec["properties"]), definitions["$id"]))
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _probe_port(probe: dict, container: dict) -> int:
    action = probe.get("httpGet") or probe.get("tcpSocket")
    port = action["port"]
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def _check_serving_container(pod: dict, container: dict) -> None:
    """What lmiserve needs from its pod: the serve command, port 8080 probed on /ping, a grace period
    longer than the preStop pause plus the drain, resources, and no root."""
    assert container["args"] == ["serve"]
    assert SERVE_PORT in [p["containerPort"] for p in container["ports"]]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert container["startupProbe"]["httpGet"]["path"] == "/ping"
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert _probe_port(container[probe], container) == SERVE_PORT, probe
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    drain = int(env.get("SERVING_DRAIN_TIMEOUT", 20))
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    # the drain, then the model's stop (up to about 10 s), all before Kubernetes sends SIGKILL
    assert pod["terminationGracePeriodSeconds"] >= pause + drain + 10
    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_deployment_and_service_validate_against_the_kubernetes_schemas():
    import kubernetes_validate

    docs = _documents(DEPLOYMENT)
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)

    deployment, service = docs
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    _check_serving_container(pod, container)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/opt/ml/model" in mounts
    assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["volumes"]}


def test_the_validation_catches_mistakes():
    """Guards on the validators themselves: a misspelt field fails, in both manifests."""
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    deployment = copy.deepcopy(_documents(DEPLOYMENT)[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)

    validator = _kserve_validator()
    service = _documents(INFERENCE_SERVICE)[0]
    for mutate in (
        lambda s: s["spec"]["predictor"].update(minReplica=1),
        lambda s: s["spec"]["predictor"]["containers"][0].update(imagePullPolicy=1),
        lambda s: s["spec"]["predictor"].update(scaleMetric="tokens"),
        lambda s: s["metadata"].update(name="LMIServe"),
    ):
        broken = copy.deepcopy(service)
        mutate(broken)
        assert list(validator.iter_errors(broken)), "a broken InferenceService validated"


def test_kserve_inference_service_validates():
    (service,) = _documents(INFERENCE_SERVICE)
    errors = sorted(_kserve_validator().iter_errors(service), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)

    predictor = service["spec"]["predictor"]
    # a custom predictor is the container KServe calls kserve-container
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    _check_serving_container(predictor, container)
    env = {e["name"]: e.get("value") for e in container["env"]}
    # KServe's storage initializer puts STORAGE_URI's files in /mnt/models; lmiserve reads them there
    assert env["SM_MODEL_DIR"] == "/mnt/models" and env["STORAGE_URI"]
    assert predictor["minReplicas"] <= predictor["maxReplicas"]
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
