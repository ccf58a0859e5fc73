"""`nitro deploy-lambda`: create or update the actor function on AWS Lambda from an ECR image.

One run is idempotent and converges the function to what the flags say:
1. checks the input offline (names, image URI, role ARN, limits) and then the two things
   a deploy most often trips on: the execution role (exists, trusts Lambda) and the image
   (exists in ECR, same region as the function);
2. creates the function (package type Image), or updates its code and then its
   configuration, waiting after each step until Lambda reports it Active / updated;
3. publishes a version and points the alias (default `live`) at it, so the scaler invokes a
   fixed version (`--function NAME:live`) and provisioned concurrency has something to attach to;
4. sets reserved concurrency on the function and provisioned concurrency on the alias.

Every action is reported as one line; `--json` adds a summary on stdout. Input errors,
a missing role or image, and Lambda's InvalidParameterValue answers exit with code 2.
Environment variable values are never printed (they may carry secrets; nitro's own functions need none:
each invocation's event carries its job's Redis user and its own keys).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nitro.cmdline import looks_secret
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB

ARCHITECTURES = ("x86_64", "arm64")
MEMORY_RANGE = (128, 10240)  # MB, Lambda's limits
TIMEOUT_RANGE = (1, 900)  # seconds: 15 minutes at most
ENV_MAX_BYTES = 4096  # Lambda's limit on all environment variables together
FUNCTION_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
ALIAS_RE = re.compile(r"(?!\d+$)[A-Za-z0-9_-]{1,128}")
ENV_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
ROLE_ARN_RE = re.compile(r"arn:aws[a-z-]*:iam::(\d{12}):role/((?:[\w+=,.@-]+/)*)([\w+=,.@-]{1,64})")
IMAGE_URI_RE = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?"
    r"/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})|@(?P<digest>sha256:[a-f0-9]{64}))?")
LAMBDA_PRINCIPAL = "lambda.amazonaws.com"


class DeployError(Exception):
    """A deploy that cannot go on; exit_code 2 for input the user can fix, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 2):
        self.exit_code = exit_code
        super().__init__(message)


@dataclass
class DeployOptions:
    function: str
    image_uri: str
    role_arn: str
    memory_mb: int = DEFAULT_ACTOR_MEMORY_MB
    timeout_s: int = 60
    architecture: str = "x86_64"
    reserved_concurrency: int | None = None  # None: leave as it is; 0 removes the reservation
    provisioned_concurrency: int | None = None  # None: leave as it is; 0 removes it from the alias
    alias: str = "live"
    env: dict[str, str] = field(default_factory=dict)  # merged over the function's current variables
    subnet_ids: list[str] = field(default_factory=list)
    security_group_ids: list[str] = field(default_factory=list)
    description: str = "nitro actor (actor_fn.handler.handler)"
    wait_provisioned_s: float = 0.0  # >0: wait until provisioned concurrency is READY
    region: str | None = None


@dataclass
class DeployResult:
    function: str
    function_arn: str = ""
    region: str = ""
    created: bool = False
    image_uri: str = ""
    architecture: str = ""
    memory_mb: int = 0
    timeout_s: int = 0
    version: str = ""
    alias: str = ""
    alias_arn: str = ""
    invoke_as: str = ""  # what to pass as `nitro train --function`
    reserved_concurrency: int | None = None
    provisioned_concurrency: int | None = None
    provisioned_status: str = ""
    env_keys: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# --- offline checks -----------------------------------------------------------------------


def parse_env(items: list[str], environ=os.environ) -> dict[str, str]:
    """KEY=VALUE pairs; KEY=@FILE reads the value from FILE, a bare KEY takes it from this process's environment.

    A secret (nitro.cmdline.looks_secret: NITRO_HMAC_KEY, NITRO_REDIS_PASSWORD, ...) must come one of those two
    ways: its literal value on the command line is refused, unshown (docs/security.md, "Command lines")."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not ENV_KEY_RE.fullmatch(key):
            raise DeployError(f"--env expects KEY=VALUE, KEY=@FILE or KEY with KEY of letters, digits and '_' "
                              f"(starting with a letter), got {key!r}" + ("=..." if sep else ""))
        if not sep:
            if key not in environ:
                raise DeployError(f"--env {key}: {key} is not set in this environment (export it, or pass "
                                  f"--env {key}=@FILE)")
            env[key] = environ[key]
            continue
        if looks_secret(key) and not value.startswith("@"):
            raise DeployError(f"--env {key}=...: a secret's value on the command line shows in `ps` and in shell "
                              f"history (the value is not shown here); pass --env {key}=@FILE (a file holding it) "
                              f"or --env {key} (taken from this environment)")
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            try:
                value = path.read_text().strip()
            except OSError as exc:
                raise DeployError(f"--env {key}=@{path}: cannot read the file: {exc.strerror}") from None
        env[key] = value
    return env


def parse_image_uri(uri: str) -> re.Match:
    m = IMAGE_URI_RE.fullmatch(uri or "")
    if not m:
        raise DeployError(f"bad image URI {uri!r}: expected an ECR image, "
                          "ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG (or @sha256:DIGEST)")
    if not (m["tag"] or m["digest"]):
        raise DeployError(f"image URI {uri!r} has no tag or digest: pin one (e.g. :0.1.0) so a deploy "
                          "is reproducible")
    return m


def validate(opts: DeployOptions) -> None:
    if not FUNCTION_RE.fullmatch(opts.function or ""):
        raise DeployError(f"bad function name {opts.function!r}: 1-64 letters, digits, '-' or '_' "
                          "(the alias is --alias, not part of the name)")
    parse_image_uri(opts.image_uri)
    if not ROLE_ARN_RE.fullmatch(opts.role_arn or ""):
        raise DeployError(f"bad role ARN {opts.role_arn!r}: expected arn:aws:iam::ACCOUNT:role/NAME")
    lo, hi = MEMORY_RANGE
    if not lo <= opts.memory_mb <= hi:
        raise DeployError(f"--memory must be in [{lo}, {hi}] MB, got {opts.memory_mb}")
    lo, hi = TIMEOUT_RANGE
    if not lo <= opts.timeout_s <= hi:
        raise DeployError(f"--timeout must be in [{lo}, {hi}] seconds (Lambda's 15 minute limit), "
                          f"got {opts.timeout_s}")
    if opts.architecture not in ARCHITECTURES:
        raise DeployError(f"--architecture must be one of {list(ARCHITECTURES)}, got {opts.architecture!r}")
    if not ALIAS_RE.fullmatch(opts.alias or ""):
        raise DeployError(f"bad alias {opts.alias!r}: 1-128 letters, digits, '-' or '_', not only digits")
    for flag, value in (("--reserved-concurrency", opts.reserved_concurrency),
                        ("--provisioned-concurrency", opts.provisioned_concurrency)):
        if value is not None and value < 0:
            raise DeployError(f"{flag} must be >= 0 (0 removes it), got {value}")
    if (opts.reserved_concurrency and opts.provisioned_concurrency
            and opts.provisioned_concurrency > opts.reserved_concurrency):
        raise DeployError(f"--provisioned-concurrency {opts.provisioned_concurrency} exceeds "
                          f"--reserved-concurrency {opts.reserved_concurrency}: Lambda rejects that")
    if bool(opts.subnet_ids) != bool(opts.security_group_ids):
        raise DeployError("--subnet-ids and --security-group-ids go together (a function in a VPC needs both)")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in opts.env.items())
    if size > ENV_MAX_BYTES:
        raise DeployError(f"environment variables take {size} bytes; Lambda allows {ENV_MAX_BYTES}")


# --- AWS ------------------------------------------------------------------------------------


def _code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _message(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", "") or str(exc)


def _access_denied(exc: Exception) -> bool:
    return _code(exc) in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")


class Deployer:
    def __init__(self, lambda_client, iam_client=None, ecr_client=None, *, out: Callable[[str], None] = print,
                 waiter_delay_s: float = 2.0, waiter_max_attempts: int = 300, sleep=time.sleep):
        self.lam = lambda_client
        self.iam = iam_client
        self.ecr = ecr_client
        self.out = out
        self._waiter_config = {"Delay": waiter_delay_s, "MaxAttempts": waiter_max_attempts}
        self._sleep = sleep

    @property
    def region(self) -> str:
        return self.lam.meta.region_name

    def _say(self, result: DeployResult, line: str) -> None:
        result.actions.append(line)
        self.out(line)

    def deploy(self, opts: DeployOptions) -> DeployResult:
        validate(opts)
        image = parse_image_uri(opts.image_uri)
        if image["region"] != self.region:
            raise DeployError(f"the image is in ECR region {image['region']} but the function would be in "
                              f"{self.region}: Lambda pulls images only from its own region "
                              "(push the image there, or pass --region)")
        result = DeployResult(function=opts.function, region=self.region, image_uri=opts.image_uri,
                              architecture=opts.architecture, memory_mb=opts.memory_mb, timeout_s=opts.timeout_s,
                              alias=opts.alias)
        self._check_role(opts, result)
        self._check_image(image, result)
        current = self._get_function(opts.function)
        if current is None:
            config = self._create(opts, result)
        else:
            config = self._update(opts, current, result)
        result.function_arn = config.get("FunctionArn", "")
        result.env_keys = sorted((config.get("Environment") or {}).get("Variables", {}) or opts.env)
        self._publish_and_alias(opts, result)
        self._concurrency(opts, result)
        return result

    # preflight --------------------------------------------------------------------------
    def _check_role(self, opts: DeployOptions, result: DeployResult) -> None:
        if self.iam is None:
            return
        name = ROLE_ARN_RE.fullmatch(opts.role_arn).group(3)
        try:
            role = self.iam.get_role(RoleName=name)["Role"]
        except Exception as exc:
            if _code(exc) == "NoSuchEntity":
                raise DeployError(f"role not found: {opts.role_arn} (create it with "
                                  "deploy/aws/lambda-trust-policy.json, see docs/deploy.md)") from None
            if _access_denied(exc):
                self.out(f"note: could not check role {name} (no iam:GetRole); Lambda will check it")
                return
            raise
        if role.get("Arn") and role["Arn"] != opts.role_arn:
            raise DeployError(f"role not found: {opts.role_arn} (this account's role {name} is {role['Arn']})")
        trust = role.get("AssumeRolePolicyDocument") or {}
        if isinstance(trust, str):  # some endpoints return it URL-encoded
            from urllib.parse import unquote

            trust = json.loads(unquote(trust))
        if LAMBDA_PRINCIPAL not in json.dumps(trust):
            raise DeployError(f"role {opts.role_arn} cannot be assumed by Lambda: its trust policy does not name "
                              f"{LAMBDA_PRINCIPAL} (use deploy/aws/lambda-trust-policy.json)")

    def _check_image(self, image: re.Match, result: DeployResult) -> None:
        if self.ecr is None:
            return
        image_id = {"imageDigest": image["digest"]} if image["digest"] else {"imageTag": image["tag"]}
        try:
            self.ecr.describe_images(registryId=image["account"], repositoryName=image["repo"], imageIds=[image_id])
        except Exception as exc:
            code = _code(exc)
            if code == "RepositoryNotFoundException":
                raise DeployError(f"image not found: ECR repository {image['repo']} does not exist in account "
                                  f"{image['account']}, region {image['region']}") from None
            if code == "ImageNotFoundException":
                raise DeployError(f"image not found: {result.image_uri} (push it first: docs/deploy.md)") from None
            if _access_denied(exc):
                self.out("note: could not check the image (no ecr:DescribeImages); Lambda will check it")
                return
            raise

    # create / update --------------------------------------------------------------------
    def _get_function(self, name: str) -> dict | None:
        try:
            return self.lam.get_function(FunctionName=name)["Configuration"]
        except self.lam.exceptions.ResourceNotFoundException:
            return None

    def _wait(self, waiter: str, name: str, what: str) -> dict:
        try:
            self.lam.get_waiter(waiter).wait(FunctionName=name, WaiterConfig=self._waiter_config)
        except Exception as exc:  # botocore WaiterError: the function went to Failed, or never settled
            config = self._get_function(name) or {}
            reason = config.get("StateReason") or config.get("LastUpdateStatusReason") or str(exc)
            code = config.get("StateReasonCode") or config.get("LastUpdateStatusReasonCode") or ""
            raise DeployError(f"{what} of {name} did not complete: {reason}" + (f" ({code})" if code else ""),
                              exit_code=1) from None
        return self._get_function(name) or {}

    def _call(self, fn, **kwargs):
        try:
            return fn(**kwargs)
        except Exception as exc:
            if _code(exc) in ("InvalidParameterValueException", "ValidationException"):
                raise DeployError(f"Lambda rejected {fn.__name__}: {_message(exc)}") from None
            raise

    def _vpc(self, opts: DeployOptions) -> dict:
        if not opts.subnet_ids:
            return {}
        return {"VpcConfig": {"SubnetIds": opts.subnet_ids, "SecurityGroupIds": opts.security_group_ids}}

    def _create(self, opts: DeployOptions, result: DeployResult) -> dict:
        self._call(self.lam.create_function, FunctionName=opts.function, PackageType="Image",
                   Code={"ImageUri": opts.image_uri}, Role=opts.role_arn, MemorySize=opts.memory_mb,
                   Timeout=opts.timeout_s, Architectures=[opts.architecture], Description=opts.description,
                   Environment={"Variables": dict(opts.env)}, Publish=False, **self._vpc(opts))
        config = self._wait("function_active_v2", opts.function, "creation")
        result.created = True
        self._say(result, f"created function {opts.function} from {opts.image_uri} "
                          f"({opts.memory_mb} MB, {opts.timeout_s} s, {opts.architecture}, "
                          f"{len(opts.env)} environment variables)")
        return config

    def _update(self, opts: DeployOptions, current: dict, result: DeployResult) -> dict:
        if current.get("PackageType", "Image") != "Image":
            raise DeployError(f"function {opts.function} is a {current['PackageType']} function; Lambda cannot "
                              "change the package type to Image: delete it or deploy under another name")
        self._wait("function_updated_v2", opts.function, "a previous update")  # a conflicting update would fail
        self._call(self.lam.update_function_code, FunctionName=opts.function, ImageUri=opts.image_uri,
                   Architectures=[opts.architecture])
        self._wait("function_updated_v2", opts.function, "the code update")
        self._say(result, f"updated code of {opts.function} to {opts.image_uri} ({opts.architecture})")
        env = dict((current.get("Environment") or {}).get("Variables") or {})
        env.update(opts.env)
        self._call(self.lam.update_function_configuration, FunctionName=opts.function, Role=opts.role_arn,
                   MemorySize=opts.memory_mb, Timeout=opts.timeout_s, Description=opts.description,
                   Environment={"Variables": env}, **self._vpc(opts))
        config = self._wait("function_updated_v2", opts.function, "the configuration update")
        self._say(result, f"updated configuration of {opts.function} ({opts.memory_mb} MB, {opts.timeout_s} s, "
                          f"{len(env)} environment variables)")
        return config

    # version, alias, concurrency --------------------------------------------------------
    def _publish_and_alias(self, opts: DeployOptions, result: DeployResult) -> None:
        version = self._call(self.lam.publish_version, FunctionName=opts.function,
                             Description=f"{opts.image_uri}")["Version"]
        result.version = version
        self._say(result, f"published version {version} of {opts.function}")
        try:
            alias = self.lam.get_alias(FunctionName=opts.function, Name=opts.alias)
        except self.lam.exceptions.ResourceNotFoundException:
            alias = None
        if alias is None:
            alias = self._call(self.lam.create_alias, FunctionName=opts.function, Name=opts.alias,
                               FunctionVersion=version)
            self._say(result, f"created alias {opts.alias} -> version {version}")
        elif alias.get("FunctionVersion") != version:
            before = alias.get("FunctionVersion")
            alias = self._call(self.lam.update_alias, FunctionName=opts.function, Name=opts.alias,
                               FunctionVersion=version)
            self._say(result, f"moved alias {opts.alias} from version {before} to {version}")
        else:
            self._say(result, f"alias {opts.alias} already points at version {version}")
        result.alias_arn = alias.get("AliasArn", "")
        result.invoke_as = f"{opts.function}:{opts.alias}"

    def _concurrency(self, opts: DeployOptions, result: DeployResult) -> None:
        if opts.reserved_concurrency:
            try:
                self.lam.put_function_concurrency(FunctionName=opts.function,
                                                  ReservedConcurrentExecutions=opts.reserved_concurrency)
            except Exception as exc:
                if _code(exc) == "InvalidParameterValueException":
                    raise DeployError(f"Lambda refused reserved concurrency {opts.reserved_concurrency}: "
                                      f"{_message(exc)} (the account keeps 100 unreserved; ask for a higher "
                                      "concurrency quota in Service Quotas)") from None
                raise
            result.reserved_concurrency = opts.reserved_concurrency
            self._say(result, f"set reserved concurrency of {opts.function} to {opts.reserved_concurrency}")
        elif opts.reserved_concurrency == 0:
            self.lam.delete_function_concurrency(FunctionName=opts.function)
            self._say(result, f"removed the reserved concurrency of {opts.function}")
        if opts.provisioned_concurrency:
            resp = self._call(self.lam.put_provisioned_concurrency_config, FunctionName=opts.function,
                              Qualifier=opts.alias, ProvisionedConcurrentExecutions=opts.provisioned_concurrency)
            status = resp.get("Status", "")
            if opts.wait_provisioned_s > 0:
                status = self._wait_provisioned(opts)
            result.provisioned_concurrency = opts.provisioned_concurrency
            result.provisioned_status = status
            self._say(result, f"set provisioned concurrency {opts.provisioned_concurrency} on alias {opts.alias} "
                              f"({status or 'requested'})")
        elif opts.provisioned_concurrency == 0:
            try:
                self.lam.delete_provisioned_concurrency_config(FunctionName=opts.function, Qualifier=opts.alias)
                self._say(result, f"removed provisioned concurrency from alias {opts.alias}")
            except Exception as exc:
                if _code(exc) != "ProvisionedConcurrencyConfigNotFoundException":
                    raise
                self._say(result, f"alias {opts.alias} has no provisioned concurrency")

    def _wait_provisioned(self, opts: DeployOptions) -> str:
        deadline = time.monotonic() + opts.wait_provisioned_s
        while True:
            cfg = self.lam.get_provisioned_concurrency_config(FunctionName=opts.function, Qualifier=opts.alias)
            status = cfg.get("Status", "")
            if status == "READY":
                return status
            if status == "FAILED":
                raise DeployError(f"provisioned concurrency on {opts.function}:{opts.alias} failed: "
                                  f"{cfg.get('StatusReason', 'no reason given')}", exit_code=1)
            if time.monotonic() >= deadline:
                return status
            self._sleep(5.0)


# --- the command ------------------------------------------------------------------------------


def clients(region: str | None):
    """Lambda, IAM and ECR clients for `region` (else the standard AWS configuration)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(region_name=region)
    if not session.region_name:
        raise DeployError("no AWS region: pass --region or set AWS_REGION")
    if session.get_credentials() is None:
        raise DeployError("no AWS credentials found (environment, ~/.aws, SSO or an instance/pod role)")
    cfg = Config(retries={"mode": "standard", "max_attempts": 8})
    return session.client("lambda", config=cfg), session.client("iam", config=cfg), session.client("ecr", config=cfg)


def options_from_args(args) -> DeployOptions:
    return DeployOptions(
        function=args.function, image_uri=args.image_uri, role_arn=args.role_arn, memory_mb=args.memory,
        timeout_s=args.timeout, architecture=args.architecture, reserved_concurrency=args.reserved_concurrency,
        provisioned_concurrency=args.provisioned_concurrency, alias=args.alias, env=parse_env(args.env),
        subnet_ids=_csv(args.subnet_ids), security_group_ids=_csv(args.security_group_ids),
        wait_provisioned_s=args.wait_provisioned, region=args.region)


def _csv(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def run(args, make_clients=None) -> int:
    """The body of `nitro deploy-lambda`; raises DeployError for the CLI to report."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    opts = options_from_args(args)
    validate(opts)  # before any client: bad input fails without credentials or network
    lam, iam, ecr = (make_clients or clients)(opts.region)
    # With --json the summary alone goes to stdout; the action lines go to stderr.
    out = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (lambda line: print(line, flush=True))
    try:
        result = Deployer(lam, iam, ecr, out=out).deploy(opts)
    except NoCredentialsError:
        raise DeployError("no AWS credentials found (environment, ~/.aws, SSO or an instance/pod role)") from None
    except ClientError as exc:
        raise DeployError(f"AWS {exc.operation_name} failed: {_code(exc)}: {_message(exc)}",
                          exit_code=2 if _access_denied(exc) else 1) from None
    except BotoCoreError as exc:
        raise DeployError(f"AWS call failed: {exc}", exit_code=1) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"invoke it as: nitro train --function {result.invoke_as} ... (scaler IAM: deploy/aws/scaler-policy.json)")
    return 0
