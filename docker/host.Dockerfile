# The agentnode-sandbox HOST image: the Kubernetes controller (`k8s-controller`) and node agent
# (`serve --node`) of deploy/, where it is named agentnode-sandbox:0.1.0 (HOST_IMAGE in
# host/k8s/objects/names.py) and overridden with kustomize's `images:`. It is NOT the sandbox image the agents
# run in (docker/Dockerfile, built by `agentnode-sandbox image build`).
#
# Build it from a checkout with a context of only what the install needs (no .venv, .state or .git):
#   tar -c --exclude=__pycache__ pyproject.toml README.md host sandbox_wrapper docker \
#     | docker build -t agentnode-sandbox-host:dev -f docker/host.Dockerfile -
# scripts/k8s-e2e does exactly that. The Python dependencies are the project's version ranges resolved
# from the package index at build time, NOT hash-pinned like the sandbox image's wheels: fine for an
# end-to-end test; for production pin them (a constraints file) and pin PYTHON_IMAGE by digest.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY host ./host
COPY sandbox_wrapper ./sandbox_wrapper
# host/_image_inputs is a symlink to ../docker (package data of the wheel)
COPY docker ./docker
RUN python3 -m venv /opt/agentnode \
 && /opt/agentnode/bin/pip install --no-cache-dir --disable-pip-version-check ".[llm,kubernetes]" \
 && /opt/agentnode/bin/python -c "import host.k8s.controller, host.k8s.node, host.k8s.client" \
 && /opt/agentnode/bin/agentnode-sandbox --help >/dev/null

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/agentnode /opt/agentnode
ENV PATH=/opt/agentnode/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
LABEL org.opencontainers.image.title="agentnode-sandbox host" \
      org.opencontainers.image.description="agentnode-sandbox Kubernetes controller and node agent"
# The deploy files set each component's user (the controller 65532, the node agent root) and a read-only
# root; this default only keeps a bare `docker run` from running as root.
USER 65532:65532
WORKDIR /tmp
# No entrypoint: deploy/ names the command (agentnode-sandbox k8s-controller | serve --node).
ENTRYPOINT []
CMD ["agentnode-sandbox", "--help"]
