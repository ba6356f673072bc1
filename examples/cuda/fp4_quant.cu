// fp4 fake-quantisers and the e2m1 rounding as CUDA kernels: a CUDA port under test.
//
// Semantics from docs/v41-reference.md §6.2 (upstream kernel.py `fp4_act_quant`, K41:116-199):
//   per block of BLOCK contiguous elements (32 for e8m0 scales, 16 for e4m3 scales)
//     amax  = max(max |x|, floor)            floor 6*2^-126 (e8m0) or 6*2^-9 (e4m3)
//     s     = 2^ceil(log2(amax * fp32(1/6)))  on the IEEE bits (e8m0)
//           = e4m3(amax / 6)                  true division, RNE, saturating at 448 (e4m3)
//     v     = clamp(x / s, -6, 6)
//     code  = e2m1(v), nearest with ties to the even code, bit 3 = sign (-0 keeps it)
//     y     = bf16(e2m1 value * s)            exact
// bf16 tensors travel as their 16-bit patterns (uint16_t), so no bf16 header is needed.
//
// Launchers are extern "C" so Python reaches them through ctypes (examples/cuda/cuda_impl.py).
// Each takes the CUDA device index (the runtime linked into this library keeps its own
// current device) and the stream to launch on, and returns a cudaError_t as int: the caller
// synchronises and reports asynchronous faults.

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kThreads = 256;  // a multiple of both block sizes: blocks never straddle CTAs

// Per-element arithmetic, shared by the kernels and the host emulation (conformance_*_host),
// which lets a machine without a GPU check the arithmetic. `/` is IEEE division on both sides
// as long as nvcc is not given --use_fast_math (-prec-div=true is the default).
#define HD __host__ __device__ __forceinline__

HD float bf16_to_float(uint16_t bits) {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

HD uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

HD float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

HD uint16_t float_to_bf16(float f) {  // round to nearest even, finite or inf
    uint32_t u = float_bits(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// Nearest e2m1 value of v (|v| <= 6 after clamping), ties to the even code index. On each
// binade the grid is uniform (step 0.5 below 2, 1 on [2, 4), 2 on [4, 6]), so rounding
// |v| / step half to even (rintf) is nearest-even on the code.
HD uint8_t e2m1(float v, float* value) {
    const bool negative = (float_bits(v) >> 31) != 0u;  // -0 keeps its sign
    const float mag = fminf(fabsf(v), 6.0f);
    const float step = mag < 2.0f ? 0.5f : (mag < 4.0f ? 1.0f : 2.0f);
    const float grid = rintf(mag / step) * step;  // exact: step is a power of two
    const int index = grid < 2.0f ? int(grid * 2.0f) : (grid < 4.0f ? int(grid) + 2 : int(grid * 0.5f) + 4);
    *value = negative ? -grid : grid;
    return uint8_t(index | (negative ? 8 : 0));
}

// Block scale from the block's max |x|: sets *scale and returns the stored scale byte.
template <bool E4M3>
HD uint8_t block_scale(float amax, float* scale) {
    if (E4M3) {
        amax = fmaxf(amax, 0.01171875f);  // 6 * 2^-9: an all-zero block keeps a nonzero scale
        __nv_fp8_e4m3 s8;
        s8.__x = __nv_cvt_float_to_fp8(amax / 6.0f, __NV_SATFINITE, __NV_E4M3);  // RNE, saturating
        *scale = float(s8);
        return s8.__x;
    }
    amax = fmaxf(amax, 7.052966104933726e-38f);  // 6 * 2^-126
    const uint32_t bits = float_bits(amax * 0.1666666716337204f);  // times fp32(1/6)
    const uint32_t exponent = ((bits >> 23) & 0xFFu) + ((bits & 0x7FFFFFu) != 0u);  // ceil to 2^k
    *scale = bits_float(exponent << 23);
    return uint8_t(exponent);
}

// One element of the block: code and bf16 y from x and the block scale.
HD uint8_t quantise(float x, float scale, uint16_t* y) {
    const float v = fminf(fmaxf(x / scale, -6.0f), 6.0f);  // -0 stays -0
    float value;
    const uint8_t code = e2m1(v, &value);
    *y = float_to_bf16(value * scale);  // exact: <= 2 bits times <= 4 bits
    return code;
}

// Max of |x| over aligned groups of BLOCK lanes (BLOCK divides 32): xor butterflies stay inside.
template <int BLOCK>
__device__ __forceinline__ float group_amax(float a) {
#pragma unroll
    for (int offset = BLOCK / 2; offset > 0; offset >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    return a;
}

template <int BLOCK, bool E4M3>
__global__ void fp4_qdq_kernel(const uint16_t* __restrict__ x, uint16_t* __restrict__ y, uint8_t* __restrict__ codes,
                               uint8_t* __restrict__ scale_bytes, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = i < n;  // n is a multiple of BLOCK: dead lanes form whole groups
    const float xv = live ? bf16_to_float(x[i]) : 0.0f;
    const float amax = group_amax<BLOCK>(fabsf(xv));
    float scale;
    const uint8_t scale_byte = block_scale<E4M3>(amax, &scale);
    if (!live) return;
    codes[i] = quantise(xv, scale, &y[i]);
    if (i % BLOCK == 0) scale_bytes[i / BLOCK] = scale_byte;
}

__global__ void e2m1_kernel(const float* __restrict__ v, uint8_t* __restrict__ codes, float* __restrict__ y,
                            long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float value;
    codes[i] = e2m1(v[i], &value);
    y[i] = value;
}

unsigned grid_for(long long n) { return unsigned((n + kThreads - 1) / kThreads); }

template <int BLOCK, bool E4M3>
int launch_fp4(int device, const void* x, void* y, void* codes, void* scale_bytes, long long n, void* stream) {
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return int(err);
    if (n <= 0) return 0;
    if (n % BLOCK != 0) return int(cudaErrorInvalidValue);
    fp4_qdq_kernel<BLOCK, E4M3><<<grid_for(n), kThreads, 0, cudaStream_t(stream)>>>(
        static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), static_cast<uint8_t*>(codes),
        static_cast<uint8_t*>(scale_bytes), n);
    return int(cudaGetLastError());
}

}  // namespace

extern "C" {

// x, y: bf16 [n] (bit patterns); codes: uint8 [n]; scale_bytes: uint8 [n / 32] (e8m0 exponents).
int conformance_fp4_e8m0(int device, const void* x, void* y, void* codes, void* scale_bytes, long long n,
                         void* stream) {
    return launch_fp4<32, false>(device, x, y, codes, scale_bytes, n, stream);
}

// x, y: bf16 [n]; codes: uint8 [n]; scale_bytes: uint8 [n / 16] (float8_e4m3fn bit patterns).
int conformance_fp4_e4m3(int device, const void* x, void* y, void* codes, void* scale_bytes, long long n,
                         void* stream) {
    return launch_fp4<16, true>(device, x, y, codes, scale_bytes, n, stream);
}

// v, y: fp32 [n]; codes: uint8 [n].
int conformance_e2m1(int device, const void* v, void* codes, void* y, long long n, void* stream) {
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return int(err);
    if (n <= 0) return 0;
    e2m1_kernel<<<grid_for(n), kThreads, 0, cudaStream_t(stream)>>>(
        static_cast<const float*>(v), static_cast<uint8_t*>(codes), static_cast<float*>(y), n);
    return int(cudaGetLastError());
}

// Host emulation of the fp4 kernels (e4m3 != 0: block 16, e4m3 scales; else block 32, e8m0):
// the same per-element code on the CPU, so the arithmetic can be checked without a GPU.
int conformance_fp4_host(int e4m3, const uint16_t* x, uint16_t* y, uint8_t* codes, uint8_t* scale_bytes,
                         long long n) {
    const int block = e4m3 ? 16 : 32;
    if (n % block != 0) return int(cudaErrorInvalidValue);
    for (long long b = 0; b < n / block; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(bf16_to_float(x[b * block + j])));
        float scale;
        scale_bytes[b] = e4m3 ? block_scale<true>(amax, &scale) : block_scale<false>(amax, &scale);
        for (int j = 0; j < block; ++j) {
            const long long i = b * block + j;
            codes[i] = quantise(bf16_to_float(x[i]), scale, &y[i]);
        }
    }
    return 0;
}

void conformance_e2m1_host(const float* v, uint8_t* codes, float* y, long long n) {
    for (long long i = 0; i < n; ++i) codes[i] = e2m1(v[i], &y[i]);
}

const char* conformance_cuda_error_string(int code) { return cudaGetErrorString(cudaError_t(code)); }

}  // extern "C"
