"""deploy/kubernetes/raycluster.yaml: every pod template valid against the Kubernetes schemas, and wired as quinebox needs."""

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "raycluster.yaml"
#: Native sidecars (an init container with restartPolicy: Always) need 1.29; validate against the oldest that has them and the newest.
VERSIONS = ("1.29.0", "1.37.0")


def cluster() -> dict:
    [doc] = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayCluster")
    return doc["spec"]


def templates() -> dict:
    spec = cluster()
    found = {"head": spec["headGroupSpec"]["template"]}
    found.update({group["groupName"]: group["template"] for group in spec["workerGroupSpecs"]})
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("group", list(templates()))
def test_each_pod_template_is_valid_kubernetes(group, version):
    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"quinebox-{group}"}, "template": templates()[group]}
    kubernetes_validate.validate(pod, version, strict=True)


def test_a_schema_violation_is_caught():
    """The check above can fail: a misspelt field and a wrong type are both refused."""
    bad = json.loads(json.dumps(templates()["boxes"]))
    bad["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": bad}, VERSIONS[0], strict=True)
    bad = json.loads(json.dumps(templates()["boxes"]))
    bad["spec"]["initContainers"][0]["securityContext"]["privileged"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": bad}, VERSIONS[0], strict=True)


def test_ray_start_parameters_are_strings_and_only_workers_run_boxes():
    spec = cluster()
    head = spec["headGroupSpec"]["rayStartParams"]
    assert head["num-cpus"] == "0" and "resources" not in head
    for group in spec["workerGroupSpecs"]:
        params = group["rayStartParams"]
        assert all(isinstance(value, str) for value in params.values())  # KubeRay passes them to `ray start` as they are
        resources = json.loads(json.loads(params["resources"]))  # KubeRay's form: a quoted JSON object
        assert isinstance(resources["quinebox"], int) and resources["quinebox"] >= 1
        assert int(params["num-cpus"]) >= resources["quinebox"]


def test_the_engine_and_the_worker_share_the_socket_and_the_state_dir_at_the_same_paths():
    pod = templates()["boxes"]["spec"]
    engine = next(c for c in pod["initContainers"] if c["name"] == "engine")
    worker = next(c for c in pod["containers"] if c["name"] == "ray-worker")
    env = {e["name"]: e.get("value") for e in worker["env"]}
    socket = env["DOCKER_HOST"].removeprefix("unix://")
    assert f"--host=unix://{socket}" in engine["args"]
    mounts = {side: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for side, c in (("engine", engine), ("worker", worker))}
    shared = {name for name in mounts["engine"] if mounts["worker"].get(name) == mounts["engine"][name]}
    assert any(socket.startswith(mounts["engine"][name] + "/") for name in shared)
    assert any(mounts["engine"][name] == env["QUINEBOX_STATE_DIR"] for name in shared)  # bind-mount sources resolve in the engine
    assert engine["restartPolicy"] == "Always"  # a sidecar, so the agent-image step after it can reach the engine
    assert "OPENAI_API_KEY" not in {e["name"] for e in engine.get("env", [])}  # the engine, which runs the boxes, never holds the key
