#!/usr/bin/env bash
# The kernels and the engine under the GPU machines' Python stack, on this CPU: Triton 3.6
# (its interpreter), transformers 5.17 and huggingface-hub 1.33, where the venv has Triton
# 3.9 and transformers 5.23 (issue 16 asks for both). `make test-device-stack` runs it.
#
# The packages go into $DEVICE_STACK_DIR (default .device-stack, git-ignored) and are put
# ahead of the venv's for this run only. Triton 3.6's interpreter also needs NumPy < 2.4
# (it converts one-element arrays to Python ints, which NumPy 2.4 refuses); transformers
# 5.17 imports httpx. Extra arguments go to pytest.
set -eu
cd "$(dirname "$0")/.."
DIR="${DEVICE_STACK_DIR:-.device-stack}"
if [ ! -f "$DIR/.installed" ]; then
    rm -rf "$DIR"
    .venv/bin/pip install --quiet --no-deps --target "$DIR" "triton==3.6.0" \
        "numpy>=2.2,<2.4" "transformers==5.17.0" "huggingface-hub==1.33.0"
    .venv/bin/pip install --quiet --target "$DIR/.httpx" httpx
    cp -r "$DIR/.httpx/." "$DIR/" && rm -rf "$DIR/.httpx"
    touch "$DIR/.installed"
fi
export PYTHONPATH="$PWD/$DIR${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/python -c 'import numpy, transformers, triton
print("triton", triton.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)'
exec .venv/bin/python -m pytest -q -p no:cacheprovider -W "ignore::DeprecationWarning" \
    tests/kernels tests/engine tests/test_hf_import.py "$@"
