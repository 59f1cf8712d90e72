#!/bin/sh
# CMAKE_ARGS for building llama-cpp-python (`make bench`): the instruction sets /proc/cpuinfo lists,
# each switched on by name, instead of GGML_NATIVE's -march=native. On this project's VMs -march=native
# enables instructions the hypervisor does not let through (the wheel died with SIGILL/SIGSEGV in
# libggml-cpu), and GGML_AVX_VNNI (the VEX form) crashes an AMD EPYC that has only AVX512-VNNI.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
args="-DGGML_NATIVE=OFF"
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 avx512vbmi:AVX512_VBMI \
    avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
    if has "${pair%%:*}"; then args="$args -DGGML_${pair#*:}=ON"; else args="$args -DGGML_${pair#*:}=OFF"; fi
done
echo "$args"
