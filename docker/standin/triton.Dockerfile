# Stand-in for nvcr.io/nvidia/tritonserver:24.10-py3 (docker/standin/README.md). Built by the compose check.
FROM python:3.11.13-slim-bookworm
LABEL org.servelab.standin="nvcr.io/nvidia/tritonserver:24.10-py3 stand-in: tritonserver 2.51 from nvidia-pytriton 0.7.0, CPU, ONNX models through an onnxruntime backend written in Python"
# nvidia-pytriton 0.7.0 ships tritonserver 2.51 (= 24.10) with the Python backend; ONNX Runtime 1.19.2
# is 24.10's release; numpy < 2 for the 2.51 stub (it crashes on BYTES inputs with numpy 2); OpenVINO
# 2024.4.0 is the one 24.10's onnxruntime backend is built with (cpu_execution_accelerator "openvino").
RUN pip install --no-cache-dir nvidia-pytriton==0.7.0 onnxruntime==1.19.2 openvino==2024.4.0 "numpy<2"
# The image's layout: /opt/tritonserver/{bin,backends}; the stub for this Python beside libtriton_python.so.
RUN T=/usr/local/lib/python3.11/dist-packages/pytriton/tritonserver \
    && ln -s "$T" /opt/tritonserver \
    && cp "$T/python_backend_stubs/3.11/triton_python_backend_stub" "$T/backends/python/" \
    && mkdir -p "$T/backends/onnxruntime" \
    && useradd --no-log-init --uid 1000 --create-home triton-server
# A Python-based backend named onnxruntime (Triton loads backends/<name>/model.py through the Python
# backend): the kit's runner, from servelab/ that Dockerfile.triton copies into /opt/servelab.
COPY onnxruntime_backend.py /opt/tritonserver/backends/onnxruntime/model.py
ENV PATH=/opt/tritonserver/bin:${PATH}
WORKDIR /opt/tritonserver
