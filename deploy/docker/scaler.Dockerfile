# syntax=docker/dockerfile:1
# nitro scaler image: the actor scaler (ActorScaler: plans, invokes actor functions through boto3, bills).
# Build from the repository root (the context must hold pyproject.toml and the packages):
#   docker build -f deploy/docker/scaler.Dockerfile -t nitro-scaler .
# Without --lambda-endpoint the scaler invokes real AWS Lambda with the standard credential chain
# (IRSA / instance role / AWS_* variables). The compose file also runs the local Lambda endpoint
# (python -m nitro.local.lambda_endpoint) from this image, for a single host without AWS.

ARG PYTHON_VERSION=3.12

# --- build: a virtualenv with the pinned dependencies and the nitro packages -----------------
# pyproject.toml lists compatible ranges; constraints.txt pins the exact tested versions. The image
# installs the core and the extras train, mujoco and atari (the environments nitro knows).
FROM python:${PYTHON_VERSION}-slim AS build
# CPU wheels of torch by default: the default index's Linux x86_64 torch pulls several GB of CUDA
# libraries that a CPU service never loads. constraints.txt pins torch's version either way.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# User environments (docs/custom-envs.md): pip requirements installed beside nitro's under the same
# constraints, e.g. --build-arg EXTRA_PIP_PACKAGES="my-envs==1.2 other-envs>=3"; wheels and sdists
# put in deploy/docker/user-packages/ are found there. The images that build environments take it:
# the learner, the actor function and the scaler image (it also runs compose's actor endpoint).
ARG EXTRA_PIP_PACKAGES=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies before code: a code change then reuses this (large) layer.
COPY pyproject.toml README.md constraints.txt ./
COPY deploy/docker/user-packages ./user-packages
# EXTRA_PIP_PACKAGES is left unquoted on purpose: each word is one requirement.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *(r for x in ('train', 'mujoco', 'atari') for r in p['optional-dependencies'][x]), sep='\n')" \
        > requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" --find-links ./user-packages -c constraints.txt \
        -r requirements.txt ${EXTRA_PIP_PACKAGES}
COPY nitro ./nitro
COPY learner_svc ./learner_svc
COPY detector_svc ./detector_svc
COPY scaler_svc ./scaler_svc
COPY actor_fn ./actor_fn
RUN pip install --no-deps . \
 && python -c "import scaler_svc.server, nitro.tools.healthcheck"

# --- runtime: slim, non-root ---------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 nitro \
 && useradd --system --uid 10001 --gid nitro --home-dir /var/lib/nitro --create-home --shell /usr/sbin/nologin nitro \
 && install -d -o nitro -g nitro /var/lib/nitro/data
COPY --from=build /opt/venv /opt/venv
# Modules that 'module:EnvId' ids may import (nitro.policy.envs); the container's environment overrides it.
ARG NITRO_ENV_MODULES=""
ENV NITRO_ENV_MODULES=${NITRO_ENV_MODULES} \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    NITRO_HEALTH_ADDR=127.0.0.1:50053
USER 10001:10001
WORKDIR /var/lib/nitro
EXPOSE 50053 9103
# gRPC health (grpc.health.v1) on the service port: set NITRO_HEALTH_ADDR too when changing --port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "nitro.tools.healthcheck", "--quiet"]
ENTRYPOINT ["python", "-m", "scaler_svc"]
# Listen on all interfaces inside the container; the secrets come from the environment
# (NITRO_HMAC_KEY_FILE, NITRO_TOKEN_FILE, NITRO_REDIS_URL), never from the image.
CMD ["--host", "0.0.0.0", "--port", "50053", "--metrics-port", "9103"]
