# syntax=docker/dockerfile:1
# nitro actor as an AWS Lambda container image (handler actor_fn.handler.handler).
# The same image serves the stellaris learner function: deploy it a second time with the command
# overridden to actor_fn.learner_handler.handler (Lambda ImageConfig.Command; docs/stellaris.md).
# Build from the repository root, for the architecture the function will run on:
#   docker buildx build --platform linux/amd64 -f deploy/docker/actor-lambda.Dockerfile -t nitro-actor .
#   (linux/arm64 for `nitro deploy-lambda --architecture arm64`)
# Lambda ignores HEALTHCHECK and runs the image as its own unprivileged user with a read-only
# filesystem except /tmp; the base image's Runtime Interface Emulator serves
# POST :8080/2015-03-31/functions/function/invocations for a smoke test under `docker run`.

ARG LAMBDA_PYTHON=3.12

# --- build on the same base, so compiled wheels match the runtime's glibc -------------------
FROM public.ecr.aws/lambda/python:${LAMBDA_PYTHON} AS build
# CPU wheels of torch: Lambda has no GPU, and the CUDA build would not fit the 10 GB image limit.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# User environments (docs/custom-envs.md): pip requirements installed beside nitro's under the same
# constraints, e.g. --build-arg EXTRA_PIP_PACKAGES="my-envs==1.2 other-envs>=3"; wheels and sdists
# put in deploy/docker/user-packages/ are found there.
ARG EXTRA_PIP_PACKAGES=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml lists compatible ranges; constraints.txt pins the exact tested versions. The image
# installs the core and the extras train, mujoco and atari (the environments nitro knows).
COPY pyproject.toml README.md constraints.txt ./
COPY deploy/docker/user-packages ./user-packages
# EXTRA_PIP_PACKAGES is left unquoted on purpose: each word is one requirement.
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *(r for x in ('train', 'mujoco', 'atari') for r in p['optional-dependencies'][x]), sep='\n')" \
        > requirements.txt \
 && pip install --extra-index-url "${TORCH_INDEX_URL}" --find-links ./user-packages -c constraints.txt \
        --target /opt/deps -r requirements.txt ${EXTRA_PIP_PACKAGES}
COPY nitro ./nitro
COPY actor_fn ./actor_fn
RUN pip install --no-deps --target /opt/app . \
 && PYTHONPATH=/opt/app:/opt/deps python3 -c "import actor_fn.handler, actor_fn.learner_handler"

# --- the function image --------------------------------------------------------------------
FROM public.ecr.aws/lambda/python:${LAMBDA_PYTHON}
COPY --from=build /opt/deps ${LAMBDA_TASK_ROOT}
COPY --from=build /opt/app ${LAMBDA_TASK_ROOT}
# Modules that 'module:EnvId' ids may import (nitro.policy.envs); the function's configuration overrides it.
ARG NITRO_ENV_MODULES=""
# Caches must go to /tmp (the only writable path). One thread per BLAS/OpenMP pool: an actor
# runs batch-1 inference on a fraction of a vCPU, where more threads only contend.
ENV NITRO_ENV_MODULES=${NITRO_ENV_MODULES} \
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/.cache \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1
# No secret, in the image or the function's configuration: each invocation's event carries its job's
# Redis user and password and its own signing key (docs/security.md, "Keys").
CMD ["actor_fn.handler.handler"]
