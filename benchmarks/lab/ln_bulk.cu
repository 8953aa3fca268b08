// Lab kernel (not the product): LayerNorm forward with rows fetched into shared memory by the
// bulk-copy engine (cp.async.bulk + mbarrier), S stages in flight per block, a persistent grid,
// and an optional split of each row across a cluster of C blocks (one DSMEM exchange per row).
// Parameters come as -D macros: DT (0 f32, 1 f16, 2 bf16), N, THREADS, R, S, C, WREG, EVICT, STCS.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#if DT == 0
typedef float T;
__device__ __forceinline__ float to_f(T a) { return a; }
__device__ __forceinline__ T from_f(float a) { return a; }
#elif DT == 1
typedef __half T;
__device__ __forceinline__ float to_f(T a) { return __half2float(a); }
__device__ __forceinline__ T from_f(float a) { return __float2half_rn(a); }
#else
typedef __nv_bfloat16 T;
__device__ __forceinline__ float to_f(T a) { return __bfloat162float(a); }
__device__ __forceinline__ T from_f(float a) { return __float2bfloat16_rn(a); }
#endif

constexpr int SEG = N / C;
constexpr int V = 16 / (int)sizeof(T);
constexpr int NVEC = SEG / V;
constexpr int G = THREADS / R;
constexpr int ITERS = (NVEC + G - 1) / G;
constexpr bool EVEN = (NVEC % G) == 0;
constexpr int NWARP_G = G >= 32 ? G / 32 : 1;
constexpr int ROW_BYTES = SEG * (int)sizeof(T);
constexpr int TILE_BYTES = R * ROW_BYTES;
constexpr float INV_SEG = 1.0f / (float)SEG;
constexpr float INV_N = 1.0f / (float)N;

struct alignas(16) Vec { T v[V]; };

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
#if EVICT
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;"
      :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy) : "memory");
#else
  (void)policy;
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}

#if C > 1
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ float ld_remote(const float* local, uint32_t rank) {
  uint32_t a = smem_addr(local), ra; float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
  return v;
}
#endif

__device__ __forceinline__ void store_vec(T* p, const Vec& v) {
#if STCS
  __stcs(reinterpret_cast<float4*>(p), *reinterpret_cast<const float4*>(&v));
#else
  *reinterpret_cast<Vec*>(p) = v;
#endif
}

// Sum over the G threads of a row; every thread of the row ends with the same bits.
__device__ __forceinline__ float row_sum(float v, float* red, int& buf, int warp, int group) {
#pragma unroll
  for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (G > 32) {
    if ((threadIdx.x & 31) == 0) red[buf * 32 + warp] = v;
    __syncthreads();
    v = 0.f;
#pragma unroll
    for (int w = 0; w < NWARP_G; ++w) v += red[buf * 32 + group * NWARP_G + w];
    buf ^= 1;
  }
  return v;
}

extern "C" __global__ void
#if C > 1
__cluster_dims__(C, 1, 1)
#endif
__launch_bounds__(THREADS, MINB)
ln_bulk(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
        T* __restrict__ y, int rows, float eps) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S * TILE_BYTES);
  float* red = reinterpret_cast<float*>(bars + S);      // [2][32]
  float* slot = red + 64;                                // [2][R][4] cluster exchange
  (void)slot;

  const int tid = threadIdx.x;
  const int group = tid / G;
  const int lane = tid % G;
  const int warp = tid >> 5;
#if C > 1
  const int crank = (int)cluster_rank();
  const int cluster_id = blockIdx.x / C;
  const int num_clusters = gridDim.x / C;
#else
  const int crank = 0;
  const int cluster_id = blockIdx.x;
  const int num_clusters = gridDim.x;
#endif
  const int tiles = (rows + R - 1) / R;
  uint64_t policy = 0;
#if EVICT
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif

  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&bars[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  auto issue = [&](int tile, int s) {
    const int r0 = tile * R;
    const int nr = rows - r0 < R ? rows - r0 : R;
    mbar_expect_tx(&bars[s], (uint32_t)(nr * ROW_BYTES));
#if C == 1
    bulk_load(stages + (size_t)s * R * SEG, x + (size_t)r0 * N, (uint32_t)(nr * ROW_BYTES),
              &bars[s], policy);
#else
    for (int r = 0; r < nr; ++r)
      bulk_load(stages + ((size_t)s * R + r) * SEG, x + (size_t)(r0 + r) * N + (size_t)crank * SEG,
                (uint32_t)ROW_BYTES, &bars[s], policy);
#endif
  };
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      const int t = cluster_id + s * num_clusters;
      if (t < tiles) issue(t, s);
    }
  }

  const T* __restrict__ wseg = w + (size_t)crank * SEG;
  const T* __restrict__ bseg = b + (size_t)crank * SEG;
#if WREG
  Vec wr[ITERS], br[ITERS];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = it * G + lane;
    if (EVEN || j < NVEC) {
      wr[it] = *reinterpret_cast<const Vec*>(wseg + (size_t)j * V);
      br[it] = *reinterpret_cast<const Vec*>(bseg + (size_t)j * V);
    }
  }
#endif
  int buf = 0;
  int k = 0;
  for (int tile = cluster_id; tile < tiles; tile += num_clusters, ++k) {
    const int s = k % S;
    mbar_wait(&bars[s], (uint32_t)((k / S) & 1));
    const int row = tile * R + group;
    const T* srow = stages + ((size_t)s * R + group) * SEG;
    const float shift = to_f(srow[0]);
#if RCACHE
    // The row slice moves to registers once; the stage is refilled while this tile computes.
    Vec cache[ITERS];
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (EVEN || j < NVEC) cache[it] = *reinterpret_cast<const Vec*>(srow + (size_t)j * V);
    }
    __syncthreads();
    if (tid == 0) {
      const int t2 = tile + S * num_clusters;
      if (t2 < tiles) issue(t2, s);
    }
#define XV(it) cache[it]
#else
#define XV(it) (*reinterpret_cast<const Vec*>(srow + (size_t)(it * G + lane) * V))
#endif
    float s1 = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (EVEN || j < NVEC) {
        const Vec xv = XV(it);
#pragma unroll
        for (int q = 0; q < V; ++q) s1 += to_f(xv.v[q]) - shift;
      }
    }
    s1 = row_sum(s1, red, buf, warp, group);
    float mean = s1 * INV_SEG;   // of x - shift, over this block's segment
    float s2 = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = it * G + lane;
      if (EVEN || j < NVEC) {
        const Vec xv = XV(it);
#pragma unroll
        for (int q = 0; q < V; ++q) { const float d = (to_f(xv.v[q]) - shift) - mean; s2 = fmaf(d, d, s2); }
      }
    }
    s2 = row_sum(s2, red, buf, warp, group);
#if C > 1
    // One exchange per row: (shift, mean, M2) of each segment; merged in rank order so that
    // every block of the cluster ends with the same bits.
    float* my = slot + ((k & 1) * R + group) * 4;
    if (lane == 0) { my[0] = shift; my[1] = mean; my[2] = s2; }
    cluster_arrive();
    cluster_wait();
    float s0 = ld_remote(my, 0);
    float n_acc = (float)SEG, m_acc = ld_remote(my + 1, 0), m2_acc = ld_remote(my + 2, 0);
#pragma unroll
    for (int r = 1; r < C; ++r) {
      const float mb = (ld_remote(my, r) - s0) + ld_remote(my + 1, r);
      const float m2b = ld_remote(my + 2, r);
      const float nn = n_acc + (float)SEG;
      const float delta = mb - m_acc;
      const float fb = (float)SEG / nn;
      m_acc = m_acc + delta * fb;
      m2_acc = m2_acc + m2b + delta * delta * n_acc * fb;
      n_acc = nn;
    }
    mean = m_acc - (shift - s0);   // relative to this segment's shift
    const float var = m2_acc * INV_N;
#else
    const float var = s2 * INV_N;
#endif
    const float rstd = 1.0f / sqrtf(var + eps);
    T* __restrict__ yr = y + (size_t)row * N + (size_t)crank * SEG;
    if (row < rows) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int j = it * G + lane;
        if (EVEN || j < NVEC) {
          const Vec xv = XV(it);
#if WREG
          const Vec wv = wr[it], bv = br[it];
#else
          const Vec wv = *reinterpret_cast<const Vec*>(wseg + (size_t)j * V);
          const Vec bv = *reinterpret_cast<const Vec*>(bseg + (size_t)j * V);
#endif
          Vec out;
#pragma unroll
          for (int q = 0; q < V; ++q) {
            const float v = ((to_f(xv.v[q]) - shift) - mean) * rstd;
            out.v[q] = from_f(fmaf(v, to_f(wv.v[q]), to_f(bv.v[q])));
          }
          store_vec(yr + (size_t)j * V, out);
        }
      }
    }
#if !RCACHE
    __syncthreads();   // every thread is done with stage s
    if (tid == 0) {
      const int t2 = tile + S * num_clusters;
      if (t2 < tiles) issue(t2, s);
    }
#endif
#undef XV
  }
#if C > 1
  cluster_arrive();
  cluster_wait();
#endif
}
