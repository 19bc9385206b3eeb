# Stand-in for nvcr.io/nvidia/tritonserver:24.10-py3-sdk (docker/standin/README.md). Built by the compose check.
FROM python:3.11.13-slim-bookworm
LABEL org.servelab.standin="nvcr.io/nvidia/tritonserver:24.10-py3-sdk stand-in: tritonclient[all] 2.50.0 and its perf_analyzer, Model Analyzer 1.46.0, Python 3.11"
# tritonclient[all] 2.50.0 carries the real perf_analyzer; it links libb64.so.0d and libcudart.so.12,
# which nvidia-pytriton 0.7.0 ships under hashed names (the kit's local target links them the same way).
# The two files are copied out and nvidia-pytriton removed again: the SDK image has no tritonserver.
ENV LD_LIBRARY_PATH=/usr/local/lib/perf-analyzer-libs
# Model Analyzer: the SDK image's is 1.45.0 (model_analyzer repository, branch r24.10, VERSION), which is
# not on PyPI; 1.46.0 is the nearest later release there. Notebook 6b's node command runs it (remote mode).
# Its wheel carries a perf_analyzer of its own, built against a newer libstdc++ than Debian 12's (it fails
# with "GLIBCXX_3.4.32 not found"), over tritonclient's: tritonclient is reinstalled last to put its back.
RUN pip install --no-cache-dir "tritonclient[all]==2.50.0" nvidia-pytriton==0.7.0 "numpy<2" triton-model-analyzer==1.46.0 \
    && pip install --no-cache-dir --no-deps --force-reinstall "tritonclient==2.50.0" \
    && L=/usr/local/lib/python3.11/dist-packages/nvidia_pytriton.libs \
    && mkdir -p /usr/local/lib/perf-analyzer-libs && cd /usr/local/lib/perf-analyzer-libs \
    && cp "$(ls $L/libb64-*.so.0d | head -n 1)" libb64.so.0d \
    && cp "$(ls $L/libcudart-*.so.12* | head -n 1)" libcudart.so.12 \
    && pip uninstall -y -q nvidia-pytriton && rm -rf "$L" \
    && perf_analyzer --version && model-analyzer --version && ! python3 -c "import pytriton"
