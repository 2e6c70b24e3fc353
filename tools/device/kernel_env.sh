# Sourced (`. tools/device/kernel_env.sh`) by the device scripts that run the op library, from the repo root ON the GPU
# machine: unpacks carried libraries (.device/*/_C.abi3.so.xz, ~9x smaller than the .so: the 64 MiB carry limit),
# installs the carried wheels (.whl: pytest and the exl3_vllm plugin) into /tmp/site, and puts them and this checkout's
# Python packages on PYTHONPATH. EXL3_ORACLE_DIR points at a carried .device/oracle (the GPU tests' ground truth).
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
export PYTHONUNBUFFERED=1 EXL3_ORACLE_DIR=$PWD/.device/oracle
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/packages/exl3-kernels/src:$PWD/packages/exl3-format/src:${PYTHONPATH:-}
