#!/bin/sh
# Runs on node-serve-system, in the background, started by notebook 2 right after Docker and the
# NVIDIA container toolkit are set up:
#
#   nohup sh ~/serve-system-chi/docker/prepare-node.sh > ~/prepare-node.log 2>&1 < /dev/null &
#
# It does now, while you finish notebook 2 and read notebook 3, the long downloads and builds that
# notebooks 3, 4 and 5 would otherwise wait for: the models image and the model files, the FastAPI
# stack's images (the PyTorch and the ONNX server), then the Triton server and SDK images and the
# Triton stack's images. Each step is what those notebooks run themselves; when it is done here,
# theirs takes seconds.
# Progress: tail -n 5 ~/prepare-node.log
set -e
# the doctor (servelab.node.doctor, "Background builds") reads this line, and the ready lines below
trap 'rc=$?; [ $rc -eq 0 ] || echo "== $(date -u +%H:%M:%S) stopped with an error (exit $rc): the notebooks'"'"' own commands redo this step"' EXIT
cd ~/serve-system-chi
python3 -m servelab.node.compose write-env --path docker/.env   # the stacks' secrets (kept if already there)

# the model files: from the trained model notebook 2 downloaded (build/trained/food11.pth), else demo weights
echo "== $(date -u +%H:%M:%S) models image and model files (notebook 3)"
docker compose -f ~/serve-system-chi/docker/docker-compose-models.yaml build
docker compose -f ~/serve-system-chi/docker/docker-compose-models.yaml run --rm models
echo "== $(date -u +%H:%M:%S) FastAPI stack images (notebook 3)"
docker compose -f ~/serve-system-chi/docker/docker-compose-fastapi.yaml build
FASTAPI_APP=fastapi_onnx docker compose -f ~/serve-system-chi/docker/docker-compose-fastapi.yaml build fastapi_server
echo "== $(date -u +%H:%M:%S) FastAPI part ready"

echo "== $(date -u +%H:%M:%S) Triton server and SDK images (notebook 5)"
# A failed pull of an image that is already here (a registry hiccup) does not stop the builds.
docker pull nvcr.io/nvidia/tritonserver:24.10-py3 || docker image inspect nvcr.io/nvidia/tritonserver:24.10-py3 > /dev/null
docker pull nvcr.io/nvidia/tritonserver:24.10-py3-sdk || docker image inspect nvcr.io/nvidia/tritonserver:24.10-py3-sdk > /dev/null
docker compose -f ~/serve-system-chi/docker/docker-compose-triton.yaml build
echo "== $(date -u +%H:%M:%S) Triton part ready"
