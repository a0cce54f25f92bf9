# The NVML sampler's native fast tier and the agent's stop watch, built where a compiler is (the
# slim image has none).
FROM python:3.11 AS native
COPY stepscope/sidecar/nvml/fast_sampler.c stepscope/sidecar/nvml/nvml_abi.h stepscope/agent/stop_watch.c /src/
RUN cc -O2 -Wall -shared -fPIC -o /src/_fast_sampler.so /src/fast_sampler.c -lpthread \
 && cc -O2 -Wall -shared -fPIC -o /src/_stop_watch.so /src/stop_watch.c -lpthread

# One image for the operator, the injected sidecar and the analysis Job (torch is not needed:
# the training image brings its own; the agent code is copied into the pod's shared volume).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY stepscope/ stepscope/
# The test doubles (stepscope/testing) are not installed: setuptools' package list leaves them out.
COPY --from=native /src/_fast_sampler.so stepscope/sidecar/nvml/
COPY --from=native /src/_stop_watch.so stepscope/agent/
RUN pip install -c constraints.txt ".[sidecar,operator,webhook]" \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin stepscope \
 && rm -rf /src
WORKDIR /
# Numeric, so that runAsNonRoot can verify it.
USER 10001
# `stepscope operator` (the Deployment), `stepscope sidecar` (injected), `stepscope analyze --session NS/NAME` (the Job).
ENTRYPOINT ["stepscope"]
CMD ["operator"]
