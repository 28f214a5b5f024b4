# anvil serve on a GPU: `docker build -t anvil .` builds anvil with the CUDA backend on NVIDIA's CUDA image;
# the result runs the OpenAI-compatible server on port 8080 over a model directory mounted at /models/model:
#
#   docker run --gpus all -p 8080:8080 -v $PWD/runs/myrun/final:/models/model:ro anvil
#   docker run --gpus all -p 8080:8080 -v ...:/models/model:ro anvil --model /models/model --kv-cache-mb 8000
#
# `docker stop` sends SIGTERM: the server stops accepting, lets running requests finish (--drain-seconds,
# default 30; give docker stop a longer -t than that), then exits 0. See docs/serving.md.
ARG CUDA_VERSION=12.6.3
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY CMakeLists.txt Makefile ./
COPY scripts scripts
COPY src src
COPY tests tests
COPY bench bench
RUN apt-get update && scripts/deps.sh --build && rm -rf /var/lib/apt/lists/*
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA=ON \
 && cmake --build build -j"$(nproc)" --target anvil
# the binary and the shared libraries it needs beyond glibc and the driver (same Ubuntu in both stages)
RUN mkdir -p /out/lib \
 && cp build/anvil /out/ \
 && ldd build/anvil | awk '/=> \// {print $3}' \
    | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' \
    | xargs -r -I{} cp -L {} /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
COPY --from=build /out/anvil /usr/local/bin/anvil
COPY --from=build /out/lib/ /usr/local/lib/anvil/
ENV LD_LIBRARY_PATH=/usr/local/lib/anvil
RUN useradd --system --no-create-home anvil
USER anvil
EXPOSE 8080
STOPSIGNAL SIGTERM
# /health answers {"status":"ok"} (503 while draining); bash's /dev/tcp, as the image has no curl
HEALTHCHECK --interval=30s --timeout=5s CMD ["/bin/bash", "-c", \
  "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '\"ok\"' <&3"]
ENTRYPOINT ["anvil", "serve", "--host", "0.0.0.0", "--port", "8080", "--device", "auto"]
CMD ["--model", "/models/model"]
