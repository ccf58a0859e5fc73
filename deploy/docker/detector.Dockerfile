# syntax=docker/dockerfile:1
# nitro detector image: the boosting detector (BoostingDetector: Hessian spectrum, convexity ratio, score).
# Build from the repository root (the context must hold pyproject.toml and the packages):
#   docker build -f deploy/docker/detector.Dockerfile -t nitro-detector .

ARG PYTHON_VERSION=3.12

# --- build: a virtualenv with the pinned dependencies and the nitro packages -----------------
# pyproject.toml lists compatible ranges; constraints.txt pins the exact tested versions. The image
# installs the core and the extras train, mujoco and atari (the environments nitro knows).
FROM python:${PYTHON_VERSION}-slim AS build
# CPU wheels of torch by default: the default index's Linux x86_64 torch pulls several GB of CUDA
# libraries that a CPU service never loads. constraints.txt pins torch's version either way.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies before code: a code change then reuses this (large) layer.
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *(r for x in ('train', 'mujoco', 'atari') for r in p['optional-dependencies'][x]), sep='\n')" \
        > requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt -r requirements.txt
COPY nitro ./nitro
COPY learner_svc ./learner_svc
COPY detector_svc ./detector_svc
COPY scaler_svc ./scaler_svc
COPY actor_fn ./actor_fn
RUN pip install --no-deps . \
 && python -c "import detector_svc.server, nitro.tools.healthcheck"

# --- runtime: slim, non-root ---------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 nitro \
 && useradd --system --uid 10001 --gid nitro --home-dir /var/lib/nitro --create-home --shell /usr/sbin/nologin nitro \
 && install -d -o nitro -g nitro /var/lib/nitro/data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    NITRO_HEALTH_ADDR=127.0.0.1:50052
USER 10001:10001
WORKDIR /var/lib/nitro
EXPOSE 50052 9102
# gRPC health (grpc.health.v1) on the service port: set NITRO_HEALTH_ADDR too when changing --port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "nitro.tools.healthcheck", "--quiet"]
ENTRYPOINT ["python", "-m", "detector_svc"]
# Listen on all interfaces inside the container; the secrets come from the environment
# (NITRO_HMAC_KEY_FILE, NITRO_TOKEN_FILE, NITRO_REDIS_URL), never from the image.
CMD ["--host", "0.0.0.0", "--port", "50052", "--metrics-port", "9102"]
