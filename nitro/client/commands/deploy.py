"""`nitro deploy-lambda`: create or update the actor function on AWS Lambda."""

from __future__ import annotations

from nitro.client.commands.common import CliError
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB


def add_deploy_lambda(sub) -> None:
    p = sub.add_parser("deploy-lambda", help="create or update the actor function on AWS Lambda from an ECR image",
                       description="Create or update the actor function (container image), publish a version, "
                                   "point an alias at it and set its concurrency. One line per action; "
                                   "exit code 2 for bad input, a missing role or image.")
    p.add_argument("--function", required=True, help="function name, e.g. nitro-actor")
    p.add_argument("--image-uri", required=True,
                   help="ECR image, ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST")
    p.add_argument("--role-arn", required=True, help="execution role (trust: deploy/aws/lambda-trust-policy.json)")
    p.add_argument("--memory", type=int, default=DEFAULT_ACTOR_MEMORY_MB,
                   help="MB, 128-10240; also sets the vCPU share, one full vCPU at 1769 (default: %(default)s)")
    p.add_argument("--timeout", type=int, default=60, help="seconds, 1-900 (default: %(default)s)")
    p.add_argument("--architecture", choices=("x86_64", "arm64"), default="x86_64",
                   help="must match the image's platform (default: %(default)s)")
    p.add_argument("--reserved-concurrency", type=int, default=None, metavar="N",
                   help="reserve N concurrent executions for the function (0 removes the reservation)")
    p.add_argument("--provisioned-concurrency", type=int, default=None, metavar="N",
                   help="keep N execution environments warm on the alias (0 removes it; billed while configured)")
    p.add_argument("--wait-provisioned", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for provisioned concurrency to be READY (default: do not wait)")
    p.add_argument("--alias", default="live", help="alias to point at the new version (default: %(default)s)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable, repeatable; KEY=@FILE reads the value from FILE, a bare KEY takes it "
                        "from this shell's environment; a secret (a KEY with PASSWORD, SECRET, TOKEN, KEY, AUTH ...) "
                        "must come one of those two ways, never as a literal value. Merged over the function's "
                        "current variables. The actors need none: each invocation's event carries its job's Redis user "
                        "and its own keys")
    p.add_argument("--subnet-ids", metavar="ID,ID", help="run in these VPC subnets (to reach a private Redis)")
    p.add_argument("--security-group-ids", metavar="ID,ID", help="security groups for --subnet-ids")
    p.add_argument("--region", default=None, help="AWS region (default: the AWS configuration)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout (action lines go to stderr)")
    p.set_defaults(func=cmd_deploy_lambda)


def cmd_deploy_lambda(args) -> int:
    from nitro.aws import lambda_deploy

    try:
        return lambda_deploy.run(args)
    except lambda_deploy.DeployError as exc:
        raise CliError(str(exc), exit_code=exc.exit_code) from None
