#!/usr/bin/env bash
# The Triton kernels under Triton 3.6's interpreter: the version the GPU machines have
# (the venv has 3.9; issue 16 asks for both). `make test-triton36` runs it.
#
# Triton 3.6 and NumPy < 2.4 go into $TRITON36_DIR (default .triton36, git-ignored) and
# are put ahead of the venv's packages for this run only. Triton 3.6's interpreter needs
# NumPy < 2.4: it converts one-element arrays to Python ints, which NumPy 2.4 refuses.
# Extra arguments go to pytest.
set -eu
cd "$(dirname "$0")/.."
DIR="${TRITON36_DIR:-.triton36}"
if [ ! -f "$DIR/.installed" ]; then
    rm -rf "$DIR"
    .venv/bin/pip install --quiet --no-deps --target "$DIR" "triton==3.6.0" "numpy>=2.2,<2.4"
    touch "$DIR/.installed"
fi
export PYTHONPATH="$PWD/$DIR${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/python -c 'import numpy, triton; print("triton", triton.__version__, "numpy", numpy.__version__)'
exec .venv/bin/python -m pytest -q -p no:cacheprovider -W "ignore::DeprecationWarning" \
    tests/kernels tests/engine/test_cuda_engine.py tests/engine/test_gemma3_oracle.py \
    tests/engine/test_llama4_oracle.py tests/engine/test_jamba_oracle.py "$@"
