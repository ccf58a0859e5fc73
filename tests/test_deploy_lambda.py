"""`nitro deploy-lambda` against moto's Lambda, IAM and ECR, and `nitro train --backend aws` fail-fast checks.

moto runs no code, so these cover the control plane: create, update, versions, aliases,
concurrency, and the errors a real deploy trips on. moto has no provisioned-concurrency API:
a small fake answers those three calls after botocore has validated the parameters against
the real API model, and it refuses qualifiers that are not existing aliases.
"""

from __future__ import annotations

import io
import json
import os
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from nitro.aws import lambda_deploy
from nitro.client import cli
from nitro.client.commands import system as system_commands
from nitro.errors import LocalSystemError

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-2"
ACCOUNT = "123456789012"  # moto's default account
REPO = "nitro-actor"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{REPO}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/nitro-actor-execution"
SECRET = "ab" * 32


@pytest.fixture
def aws(monkeypatch):
    for k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    with mock_aws():
        iam = boto3.client("iam", region_name=REGION)
        trust = (ROOT / "deploy/aws/lambda-trust-policy.json").read_text()  # the shipped trust policy
        iam.create_role(RoleName="nitro-actor-execution", AssumeRolePolicyDocument=trust)
        ecr = boto3.client("ecr", region_name=REGION)
        ecr.create_repository(repositoryName=REPO)
        for tag in ("0.1.0", "0.2.0"):
            ecr.put_image(repositoryName=REPO, imageTag=tag, imageManifest=json.dumps({
                "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 100,
                           "digest": "sha256:" + tag.replace(".", "") * 8},
                "layers": []}))
        fake = FakeProvisioned()
        real_clients = lambda_deploy.clients

        def clients(region):
            lam, iam_c, ecr_c = real_clients(region)
            fake.attach(lam)
            return lam, iam_c, ecr_c

        monkeypatch.setattr(lambda_deploy, "clients", clients)
        yield types.SimpleNamespace(lam=boto3.client("lambda", region_name=REGION), iam=iam, ecr=ecr,
                                    provisioned=fake.configs)


class FakeProvisioned:
    """Put/Get/DeleteProvisionedConcurrencyConfig on a botocore client, which moto lacks."""

    OPS = ("PutProvisionedConcurrencyConfig", "GetProvisionedConcurrencyConfig",
           "DeleteProvisionedConcurrencyConfig")

    def __init__(self):
        self.configs: dict[tuple[str, str], int] = {}

    def attach(self, client) -> None:
        self.client = client
        for op in self.OPS:
            client.meta.events.register(f"before-parameter-build.lambda.{op}", self._capture)
            client.meta.events.register(f"before-call.lambda.{op}", self._answer)

    @staticmethod
    def _capture(params, context, **_):
        context["fake_params"] = dict(params)

    def _answer(self, model, context, **_):
        p = context["fake_params"]
        try:  # like Lambda: the qualifier must be an alias (or version) that exists
            self.client.get_alias(FunctionName=p["FunctionName"], Name=p["Qualifier"])
        except self.client.exceptions.ResourceNotFoundException:
            return _error(404, "ResourceNotFoundException", f"no alias {p['Qualifier']}")
        key = (p["FunctionName"], p["Qualifier"])
        if model.name == "PutProvisionedConcurrencyConfig":
            self.configs[key] = p["ProvisionedConcurrentExecutions"]
            return _ok(202, {"RequestedProvisionedConcurrentExecutions": self.configs[key], "Status": "IN_PROGRESS"})
        if key not in self.configs:
            return _error(404, "ProvisionedConcurrencyConfigNotFoundException", "none")
        if model.name == "DeleteProvisionedConcurrencyConfig":
            del self.configs[key]
            return _ok(204, {})
        n = self.configs[key]
        return _ok(200, {"RequestedProvisionedConcurrentExecutions": n, "AllocatedProvisionedConcurrentExecutions": n,
                         "AvailableProvisionedConcurrentExecutions": n, "Status": "READY"})


def _ok(status: int, body: dict):
    return types.SimpleNamespace(status_code=status, headers={}), {**body, "ResponseMetadata": {"HTTPStatusCode": status}}


def _error(status: int, code: str, message: str):
    return (types.SimpleNamespace(status_code=status, headers={}),
            {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}})


def deploy(*flags: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(["deploy-lambda", "--function", "nitro-actor", "--role-arn", ROLE, *flags])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_create_then_update_converges_function_version_alias_and_concurrency(aws, tmp_path, monkeypatch):
    key_file = tmp_path / "hmac.key"
    key_file.write_text(SECRET + "\n")
    monkeypatch.setenv("NITRO_REDIS_PASSWORD", "pw")  # a bare --env NAME takes the value from the environment
    rc, out, err = deploy("--image-uri", f"{IMAGE}:0.1.0", "--memory", "1536", "--timeout", "120",
                          "--architecture", "arm64", "--reserved-concurrency", "50", "--provisioned-concurrency", "4",
                          "--env", f"NITRO_HMAC_KEY=@{key_file}", "--env", "NITRO_REDIS_PASSWORD", "--json")
    assert rc == 0, err
    summary = json.loads(out)  # with --json stdout holds the summary alone
    assert summary["created"] is True and summary["version"] == "1" and summary["invoke_as"] == "nitro-actor:live"
    assert summary["reserved_concurrency"] == 50 and summary["provisioned_concurrency"] == 4
    assert summary["env_keys"] == ["NITRO_HMAC_KEY", "NITRO_REDIS_PASSWORD"]
    lines = err.strip().splitlines()
    assert lines[0].startswith("created function nitro-actor from") and "1536 MB, 120 s, arm64" in lines[0]
    assert lines[1:] == ["published version 1 of nitro-actor", "created alias live -> version 1",
                         "set reserved concurrency of nitro-actor to 50",
                         "set provisioned concurrency 4 on alias live (IN_PROGRESS)"]
    assert summary["actions"] == lines
    assert SECRET not in out + err and "pw" not in json.dumps(summary["actions"])

    fn = aws.lam.get_function(FunctionName="nitro-actor")
    cfg = fn["Configuration"]
    assert (cfg["PackageType"], cfg["MemorySize"], cfg["Timeout"], cfg["Architectures"], cfg["Role"]) == \
        ("Image", 1536, 120, ["arm64"], ROLE)
    assert fn["Code"]["ImageUri"] == f"{IMAGE}:0.1.0"
    assert cfg["Environment"]["Variables"] == {"NITRO_HMAC_KEY": SECRET, "NITRO_REDIS_PASSWORD": "pw"}
    assert aws.lam.get_alias(FunctionName="nitro-actor", Name="live")["FunctionVersion"] == "1"
    assert aws.lam.get_function_concurrency(FunctionName="nitro-actor")["ReservedConcurrentExecutions"] == 50
    assert aws.provisioned == {("nitro-actor", "live"): 4}

    # The same function again: code, then configuration (variables merged), a new version, the alias moved.
    rc, out, err = deploy("--image-uri", f"{IMAGE}:0.2.0", "--memory", "2048", "--timeout", "120",
                          "--architecture", "arm64", "--env", "EXTRA=1", "--provisioned-concurrency", "0")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == f"updated code of nitro-actor to {IMAGE}:0.2.0 (arm64)"
    assert lines[1] == "updated configuration of nitro-actor (2048 MB, 120 s, 3 environment variables)"
    assert lines[2:5] == ["published version 2 of nitro-actor", "moved alias live from version 1 to 2",
                          "removed provisioned concurrency from alias live"]
    assert lines[5].startswith("invoke it as: nitro train --function nitro-actor:live")
    fn = aws.lam.get_function(FunctionName="nitro-actor")
    assert fn["Code"]["ImageUri"] == f"{IMAGE}:0.2.0" and fn["Configuration"]["MemorySize"] == 2048
    assert fn["Configuration"]["Environment"]["Variables"] == {"NITRO_HMAC_KEY": SECRET, "NITRO_REDIS_PASSWORD": "pw",
                                                               "EXTRA": "1"}
    assert aws.lam.get_alias(FunctionName="nitro-actor", Name="live")["FunctionVersion"] == "2"
    assert aws.provisioned == {}
    # Reserved concurrency untouched when not given; 0 removes it.
    assert aws.lam.get_function_concurrency(FunctionName="nitro-actor")["ReservedConcurrentExecutions"] == 50
    rc, out, err = deploy("--image-uri", f"{IMAGE}:0.2.0", "--reserved-concurrency", "0")
    assert rc == 0, err
    assert "removed the reserved concurrency of nitro-actor" in out
    assert "ReservedConcurrentExecutions" not in aws.lam.get_function_concurrency(FunctionName="nitro-actor")


@pytest.mark.slow
def test_provisioned_concurrency_on_a_custom_alias_and_wait_until_ready(aws):
    rc, out, err = deploy("--image-uri", f"{IMAGE}:0.1.0", "--alias", "canary", "--provisioned-concurrency", "2",
                          "--wait-provisioned", "30")
    assert rc == 0, err
    assert "set provisioned concurrency 2 on alias canary (READY)" in out
    assert aws.provisioned == {("nitro-actor", "canary"): 2}


@pytest.mark.parametrize("flags, message", [
    (["--image-uri", "docker.io/library/python:3.12"], "bad image URI"),
    (["--image-uri", f"{IMAGE}"], "has no tag or digest"),
    (["--image-uri", f"{IMAGE}:9.9.9"], "image not found"),
    (["--image-uri", f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/missing:1"], "does not exist"),
    (["--image-uri", f"{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/{REPO}:0.1.0"], "only from its own region"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--role-arn", f"arn:aws:iam::{ACCOUNT}:role/nope"], "role not found"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--role-arn", "nitro-actor-execution"], "bad role ARN"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--memory", "64"], "--memory must be in [128, 10240]"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--timeout", "901"], "15 minute limit"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--reserved-concurrency", "2", "--provisioned-concurrency", "4"],
     "exceeds --reserved-concurrency"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--env", "1BAD=x"], "--env expects KEY=VALUE"),
    # A secret's literal value would show in `ps`: refused, with the two ways that keep it off the command line.
    (["--image-uri", f"{IMAGE}:0.1.0", "--env", "NITRO_HMAC_KEY=" + SECRET],
     "--env NITRO_HMAC_KEY=...: a secret's value on the command line shows in `ps`"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--env", "NITRO_REDIS_PASSWORD=pw"], "--env NITRO_REDIS_PASSWORD=@FILE"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--env", "NITRO_NOT_SET_ANYWHERE"], "is not set in this environment"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--env", "BIG=" + "x" * 5000], "Lambda allows 4096"),
    (["--image-uri", f"{IMAGE}:0.1.0", "--subnet-ids", "subnet-1"], "go together"),
])
def test_bad_input_exits_2_with_a_clear_message_and_creates_nothing(aws, flags, message):
    rc, out, err = deploy(*flags)
    assert rc == 2, (out, err)
    assert err.startswith("error: ") and message in err, err
    assert SECRET not in out + err
    assert aws.lam.list_functions()["Functions"] == []


def test_role_that_lambda_cannot_assume_is_refused(aws):
    aws.iam.create_role(RoleName="ec2-only", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                "Action": "sts:AssumeRole"}]}))
    rc, _, err = deploy("--image-uri", f"{IMAGE}:0.1.0", "--role-arn", f"arn:aws:iam::{ACCOUNT}:role/ec2-only")
    assert rc == 2 and "cannot be assumed by Lambda" in err


def test_a_zip_function_of_the_same_name_is_not_converted(aws):
    aws.lam.create_function(FunctionName="nitro-actor", Runtime="python3.12", Role=ROLE, Handler="h.handler",
                            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})
    rc, _, err = deploy("--image-uri", f"{IMAGE}:0.1.0")
    assert rc == 2 and "cannot change the package type" in err


def test_a_function_that_fails_to_become_active_reports_lambdas_reason():
    class Waiter:
        def wait(self, **_):
            raise RuntimeError("Waiter FunctionActiveV2 failed: terminal failure")

    class Lambda:
        meta = types.SimpleNamespace(region_name=REGION)
        exceptions = types.SimpleNamespace(ResourceNotFoundException=KeyError)
        created = False

        def get_function(self, FunctionName):
            if not self.created:
                raise KeyError(FunctionName)
            return {"Configuration": {"State": "Failed", "StateReasonCode": "ImageAccessDenied",
                                      "StateReason": "Lambda does not have permission to access the ECR image."}}

        def create_function(self, **kwargs):
            self.created = True

        def get_waiter(self, name):
            return Waiter()

    opts = lambda_deploy.DeployOptions(function="nitro-actor", image_uri=f"{IMAGE}:0.1.0", role_arn=ROLE)
    with pytest.raises(lambda_deploy.DeployError) as exc:
        lambda_deploy.Deployer(Lambda(), out=lambda _: None).deploy(opts)
    assert "creation of nitro-actor did not complete" in str(exc.value) and "(ImageAccessDenied)" in str(exc.value)


def test_no_credentials_is_a_clear_error(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    rc, _, err = deploy("--image-uri", f"{IMAGE}:0.1.0", "--region", REGION)
    assert rc == 2 and "no AWS credentials" in err


# --- nitro train --backend aws ------------------------------------------------------------------


def train(*flags: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = cli.main(["train", "--env", "CartPole-v1", "--state-dir", "/nonexistent-nitro-state", *flags])
    return rc, err.getvalue()


@pytest.mark.parametrize("flags, message", [
    (["--backend", "aws", "--local"], "needs --function NAME"),
    (["--backend", "aws", "--local", "--function", "nitro-actor:live"], "needs --actor-redis-url"),
    (["--backend", "aws", "--local", "--function", "f", "--actor-redis-url", "redis://127.0.0.1:6379/0"], "loopback"),
    (["--backend", "aws", "--local", "--function", "f", "--actor-redis-url", "redis://:pw@10.0.0.5:6379/0"],
     "must not carry the password"),
    (["--backend", "aws", "--local", "--function", "f", "--actor-redis-url", "http://10.0.0.5"], "must look like"),
])
def test_train_backend_aws_fails_fast_on_missing_settings(aws, flags, message):
    rc, err = train(*flags)
    assert rc == 2 and message in err, err


def test_train_backend_aws_starts_the_local_system_without_the_local_endpoint(aws, monkeypatch, tmp_path):
    """The CLI's side of the contract with LocalSystem (see _aws_backend). The deployed function holds no secret
    (each invocation's event carries its job's Redis user and its keys), so none is asked for or passed on."""
    for k in ("NITRO_HMAC_KEY", "NITRO_HMAC_KEY_FILE", "NITRO_REDIS_PASSWORD", "NITRO_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(k, raising=False)
    flags = ["--backend", "aws", "--local", "--function", "nitro-actor:live", "--actor-redis-url",
             "redis://203.0.113.7:6390/0"]
    seen = {}

    class FakeSystem:
        def __init__(self, state_dir, ports=None, *, concurrency=64, startup_timeout_s=180.0, lambda_backend="local",
                     actor_redis_url=None, aws_region=None, redis_bind=None, restart_policy=None, monitoring=False):
            seen.update(ports=ports, lambda_backend=lambda_backend, actor_redis_url=actor_redis_url,
                        aws_region=aws_region, redis_bind=redis_bind)

        def start(self):
            raise LocalSystemError("stop here")

        def request_stop(self):
            pass

        def stop(self):
            return []

    monkeypatch.setattr(system_commands, "LocalSystem", FakeSystem)
    rc, err = train(*flags)
    assert rc == 1 and "stop here" in err, err
    assert seen == {"ports": {"redis": 6390}, "lambda_backend": "aws", "actor_redis_url": "redis://203.0.113.7:6390/0",
                    "aws_region": REGION, "redis_bind": "0.0.0.0"}


# --- deploy/aws IAM documents -------------------------------------------------------------------

POLICIES = sorted((ROOT / "deploy/aws").glob("*-policy.json"))
# Actions AWS offers no resource-level permission for: the only ones allowed on "*".
UNSCOPABLE = {"ecr:GetAuthorizationToken", "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces",
              "ec2:DescribeSubnets", "ec2:DeleteNetworkInterface", "ec2:AssignPrivateIpAddresses",
              "ec2:UnassignPrivateIpAddresses", "ec2:DescribeSecurityGroups", "ec2:DescribeVpcs"}


def statements(path: Path) -> list[dict]:
    return json.loads(path.read_text())["Statement"]


def as_list(v) -> list:
    return v if isinstance(v, list) else [v]


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_iam_documents_are_valid_and_least_privilege(aws, path):
    text = path.read_text().replace("REGION", REGION).replace("ACCOUNT_ID", ACCOUNT)
    if path.name == "lambda-trust-policy.json":
        aws.iam.create_role(RoleName="trust-check", AssumeRolePolicyDocument=text)
    else:
        aws.iam.create_policy(PolicyName=path.stem, PolicyDocument=text)  # moto checks the grammar
    for st in statements(path):
        assert st["Effect"] == "Allow" and st.get("Sid")
        actions = as_list(st["Action"])
        assert not any(a == "*" or a.endswith(":*") for a in actions), actions
        if "Resource" in st and "*" in as_list(st["Resource"]):
            assert set(actions) <= UNSCOPABLE, f"{path.name} {st['Sid']}: {actions} on *"


def test_scaler_may_only_invoke_the_actor_function():
    (st,) = statements(ROOT / "deploy/aws/scaler-policy.json")
    assert st["Action"] == "lambda:InvokeFunction"
    assert st["Resource"] == ["arn:aws:lambda:REGION:ACCOUNT_ID:function:nitro-actor",
                              "arn:aws:lambda:REGION:ACCOUNT_ID:function:nitro-actor:live"]


def test_deployer_passes_only_the_execution_role_and_only_to_lambda():
    sts = statements(ROOT / "deploy/aws/deployer-policy.json")
    (passrole,) = [s for s in sts if "iam:PassRole" in as_list(s["Action"])]
    assert passrole["Resource"] == "arn:aws:iam::ACCOUNT_ID:role/nitro-actor-execution"
    assert passrole["Condition"] == {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}
    lam = [s for s in sts if any(a.startswith("lambda:") for a in as_list(s["Action"]))]
    for s in lam:
        assert all(r.startswith("arn:aws:lambda:REGION:ACCOUNT_ID:function:nitro-actor") for r in as_list(s["Resource"]))
    # Everything deploy-lambda calls is granted (botocore operation names -> IAM actions).
    granted = {a for s in lam for a in as_list(s["Action"])}
    import re

    calls = set(re.findall(r"self\.lam\.(\w+)", Path(lambda_deploy.__file__).read_text()))
    calls -= {"meta", "exceptions", "get_waiter"}  # not API calls; the waiters poll GetFunction
    used = {"lambda:" + "".join(w.capitalize() for w in c.split("_")) for c in calls} | {"lambda:GetFunction"}
    assert len(used) >= 12 and used <= granted, sorted(used - granted)
