
// autonorm LayerNorm forward: t128v2r1-smem-two_pass-c1-p0-k
// problem: hidden=4096 dtype=float32 weight=True bias=True
// rendered by autonorm 0.1.0+96473fff10af; do not edit: re-render instead.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace autonorm_ln_db0f7acede479074_ns {

constexpr int N = 4096;          // hidden size (elements per row)
constexpr int SEG = 4096;      // elements of a row this block handles (N / cluster)
constexpr int NVEC = 2048;    // vectors per segment
constexpr int V = 2;          // elements per vector access
constexpr int G = 128;          // threads per row
constexpr int R = 1;          // rows per block
constexpr int ITERS = 16;  // vector accesses per thread per row
constexpr int NWARP_G = 4;  // warps per row (1 for sub-warp rows)
constexpr float INV_N = 1.0f / (float)N;

typedef float T;
struct alignas(8) Vec { T v[V]; };

__device__ __forceinline__ float to_f(T a) { return a; }
__device__ __forceinline__ T from_f(float a) { return a; }

// V fp32 results to one vector of T. Pairs of 16-bit values convert in one instruction
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32) and land in one register, ready for the 16-byte store.
__device__ __forceinline__ Vec pack(const float* o) {
  Vec out;
#pragma unroll
  for (int k = 0; k < V; ++k) out.v[k] = from_f(o[k]);
  return out;
}
// Element k of a vector as fp32. bf16 pairs share a 32-bit register: the low element widens
// with one shift and the high one with one mask, where converting each alone extracted it first
// (PRMT, then SHF: two instructions; sm_90 SASS of the fwd kernel at bf16 1024, 2026-11-30).
__device__ __forceinline__ float elem(const Vec& v, int k) {
  return to_f(v.v[k]);
}
__device__ __forceinline__ Vec load_vec(const T* p) { return *reinterpret_cast<const Vec*>(p); }
__device__ __forceinline__ void store_vec(T* p, const Vec& v) { *reinterpret_cast<Vec*>(p) = v; }
// keep_x: x's loads carry an L2 evict_last policy, as the bulk kernel's copies do. x1.02-1.03 at
// the 16-bit 1024 and bf16 4096 winners, x1.01 at 768, x1.00 at 8192 and fp32 (H200,
// benchmarks/NOTES.md 121). .nc as the plain loads of a __restrict__ const pointer compile to.
__device__ __forceinline__ Vec load_x(const T* p, unsigned long long pol) {
  uint2 r;
  asm("ld.global.nc.L2::cache_hint.v2.u32 { %0, %1 }, [%2], %3;"
      : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(pol));
  return *reinterpret_cast<const Vec*>(&r);  // NVRTC has no memcpy; r is as aligned as Vec
}
// One vector from global to shared memory by cp.async: .cg (L2 only) takes only 16 bytes,
// .ca the 4- and 8-byte vectors.
__device__ __forceinline__ void copy_async(T* dst, const T* src, unsigned long long pol) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2;"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "l"(pol) : "memory");
}
__device__ __forceinline__ void row_barrier(int) { __syncthreads(); }

// Knuth's TwoSum: (s, m) becomes (s + m rounded, the exact remainder). Welford keeps its shift
// at its running mean with it, so x - shift stays small when the row's first element is an
// outlier (H200, fp32: 0.9e-6..1e-5 -> 0.9e-7..1.3e-7 on the verifier's outlier case; NOTES.md 26).
__device__ __forceinline__ void rebase(float& s, float& m) {
  const float t = s + m;
  const float bb = t - s;
  m = (s - (t - bb)) + (m - bb);
  s = t;
}

// Chan et al.: merge two (count, shift + mean, M2) partials, then re-base on the merged mean.
// Exact for any split of the data; an empty partial takes the other one as it is.
__device__ __forceinline__ void chan_merge_shifted(float& n, float& s, float& m, float& m2,
                                                   float nb, float sb, float mb, float m2b) {
  if (nb == 0.f) return;
  if (n == 0.f) { n = nb; s = sb; m = mb; m2 = m2b; return; }
  const float nn = n + nb;
  const float delta = (sb - s) + (mb - m);
  const float fb = nb / nn;
  m = m + delta * fb;
  m2 = m2 + m2b + delta * delta * n * fb;
  n = nn;
  rebase(s, m);
}

}  // namespace autonorm_ln_db0f7acede479074_ns

extern "C" __global__ void
__launch_bounds__(128, 5)
autonorm_ln_db0f7acede479074(const float* __restrict__ x,
           const float* __restrict__ w,
           const float* __restrict__ b,
           float* __restrict__ y,
           int rows, float eps,
           unsigned int* __restrict__ work) {
  using namespace autonorm_ln_db0f7acede479074_ns;
  unsigned long long xpol;  // keep_x: the L2 policy of every load of x
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(xpol));
  (void)work;  // the bulk kernel's tile counter; this kernel's rows follow the grid statically
  // Reduction scratch: [2 buffers][32 warps][4 floats], then the cluster slots [2][4], then the
  // shared-memory row cache (when used). Two buffers let consecutive reductions run with one
  // barrier each: a buffer is rewritten only after everyone passed the barrier in between.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* red = reinterpret_cast<float*>(smem_raw);
  float* cl_slot = red + 2 * 32 * 4;
  T* smem_rows = reinterpret_cast<T*>(smem_raw + 1056);
  (void)red; (void)cl_slot;

  const int tid = threadIdx.x;
  const int group = tid / G;   // which row of the block
  const int lane = tid % G;    // position inside the row's threads
  const int warp = tid >> 5;
  (void)warp;
  const unsigned gmask = 0xffffffffu;
  (void)gmask;
  int buf = 0;
  (void)buf;
  const int crank = 0;
  const int cluster_id = blockIdx.x;
  const int num_clusters = gridDim.x;
  const int tiles = (rows + R - 1) / R;
  const T* __restrict__ wseg = w + (size_t)crank * SEG;
  const T* __restrict__ bseg = b + (size_t)crank * SEG;
  (void)wseg; (void)bseg;
  for (int tile = cluster_id; tile < tiles; tile += num_clusters) {
    const int row = tile * R + group;
    {
    const size_t row_base = (size_t)row * N;
    const T* __restrict__ xr = x + row_base + (size_t)crank * SEG;
    T* __restrict__ yr = y + row_base + (size_t)crank * SEG;
    // Per-row shift: the row's first element, identical for every block of a cluster. Summing
    // x - shift keeps rows far from zero (mean 1000, spread 0.1) exact in fp32.
    const float shift = to_f(x[row_base]);
    (void)shift;
    T* __restrict__ srow = smem_rows + (size_t)group * SEG;
    // Every vector of the row in flight at once, copied by cp.async without passing through
    // registers (codegen.fills_async). Each thread reads back only the vectors it copied (the
    // same j in every pass), so waiting for its own copies is enough: no barrier.
#pragma unroll 4
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (true) copy_async(srow + (size_t)j * V, xr + (size_t)j * V, xpol);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    // Pass 1: mean of x - shift. Pass 2: centred sum of squares over the cached row.
    float s1 = 0.f;

#pragma unroll 4
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (true) {
        const Vec xv = load_vec(srow + (size_t)j * V);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xf = elem(xv, k);
          s1 += xf - shift;
        }
      }
    }
// sum s1 over the row
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s1 += __shfl_xor_sync(gmask, s1, o);
    if ((tid & 31) == 0) red[(buf * 32 + warp) * 3] = s1;
    row_barrier(group);
    s1 = 0.f;
#pragma unroll
    for (int w = 0; w < NWARP_G; ++w) s1 += red[(buf * 32 + group * NWARP_G + w) * 3];
    buf ^= 1;
    const float mean = s1 * INV_N;  // mean of x - shift
    float s2 = 0.f;
    // Centre of pass 2 in one register: its rounding (half an ulp of shift + mean) enters the
    // centred sum of squares only squared, n * e^2 (offset rows: 1e-7 of the variance).
    const float centre = shift + mean;
    // fp32: corrected two-pass (Chan, Golub, LeVeque 1983). Pass 1's mean of x - shift loses
    // bits when the shift (the first element) is far from the row's mean; the mean of x - centre
    // from pass 2 corrects it, and the row is normalized around centre, where x - centre is exact
    // for rows far from zero.
    float s3 = 0.f;

#pragma unroll 4
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (true) {
        const Vec xv = load_vec(srow + (size_t)j * V);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xf = elem(xv, k);
          const float d = xf - centre; s2 = fmaf(d, d, s2); s3 += d;
        }
      }
    }
// sum s2 and s3 over the row, one barrier for both
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s2 += __shfl_xor_sync(gmask, s2, o);
      s3 += __shfl_xor_sync(gmask, s3, o);
    }
    if ((tid & 31) == 0) {
      red[(buf * 32 + warp) * 3 + 0] = s2;
      red[(buf * 32 + warp) * 3 + 1] = s3;
    }
    row_barrier(group);
    s2 = 0.f;
    s3 = 0.f;
#pragma unroll
    for (int w = 0; w < NWARP_G; ++w) {
      s2 += red[(buf * 32 + group * NWARP_G + w) * 3 + 0];
      s3 += red[(buf * 32 + group * NWARP_G + w) * 3 + 1];
    }
    buf ^= 1;
    const float cshift = centre;
    const float cmean = s3 * INV_N;  // mean of x - centre
    const float var = fmaxf(s2 * INV_N - cmean * cmean, 0.f);
    // IEEE sqrt and division (not rsqrtf): once per row, and it keeps fp32 within a few ulp.
    const float rstd = 1.0f / sqrtf(var + eps);
#pragma unroll 4
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (true) {
        const Vec xv = load_vec(srow + (size_t)j * V);
        const Vec wv = load_vec(wseg + (size_t)j * V);
        const Vec bv = load_vec(bseg + (size_t)j * V);
        float o[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          // (x - cshift) - cmean: the row's mean relative to its shift is small and exact in
          // fp32, while the absolute mean of a row near 1000 is off by up to half an ulp (3e-5),
          // which is 3e-4 of a 0.1 spread (measured: every config at rel. error 1.6e-4 before).
          float v = ((elem(xv, k) - cshift) - cmean) * rstd;
          v = fmaf(v, elem(wv, k), elem(bv, k));
          o[k] = v;
        }
        store_vec(yr + (size_t)j * V, pack(o));
      }
    }
    }
  }
}
