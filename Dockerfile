# One image for the API and the GPU worker. torch==2.13.0 from PyPI is the CUDA build on Linux.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY sweeper ./sweeper
COPY api ./api
COPY dashboards ./dashboards
COPY spaces ./spaces
RUN pip install -c constraints.txt "torch==2.13.0" .
# g++ is what torch.compile's Inductor needs for CPU kernels; Triton brings its own for CUDA.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
# uid 1000: deploy/kubernetes runs the pods as that user
RUN useradd --create-home --uid 1000 sweeper
USER sweeper
ENV SWEEPER_CACHE_DIR=/home/sweeper/.cache/sweeper
CMD ["sweeper", "--help"]
