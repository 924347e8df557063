// GPU harness for kiln's flash attention kernel (same source as kiln, NVRTC-compiled):
//   1. compiles every variant (tilings x causal x masks x dtypes) in parallel, prints registers,
//      spills and CTAs/SM;
//   2. checks each against a naive fp32 reference kernel over many shapes (ragged lengths, Lq !=
//      Lk, causal, bool/additive masks with fully masked rows, GQA, [B,T,H,D] views, bf16/f16);
//   3. times the tilings on the benchmark shapes (CUDA events per launch, GPU kept busy by a
//      spin kernel while the host queues, inputs rotated), and prints a table.
//   harness [--sanitize]   (--sanitize: small shapes, default tilings only, no timing)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fa_lib.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

// ---- device helpers ----------------------------------------------------------------------------

__device__ float h2f(unsigned short h, int bf16) {
  if (bf16) return __uint_as_float(((unsigned)h) << 16);
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
  return f;
}
__device__ unsigned short f2h(float f, int bf16) {
  unsigned short h;
  if (bf16) {
    asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(f));
  } else {
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
  }
  return h;
}
__device__ unsigned hash32(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
__device__ float unif(long long i, unsigned seed) {
  return (hash32((unsigned)i * 2654435761U ^ hash32(seed + (unsigned)(i >> 32))) + 0.5f) *
         2.3283064e-10f;
}
__device__ float normal(long long i, unsigned seed) {
  const float u1 = unif(2 * i, seed), u2 = unif(2 * i + 1, seed);
  return sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
}

__global__ void fill16(unsigned short* p, long long n, unsigned seed, int bf16) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    p[i] = f2h(normal(i, seed), bf16);
}

// Masks over [B, H, L, S] stored with the given sizes (broadcast dims of size 1). kind: 1 bool,
// 2 f32, 3 f16, 4 bf16 additive. Rows r % 7 == 3 are fully masked when full_rows.
__global__ void fill_mask(void* p, long long n, long long cols, unsigned seed, int kind,
                          int full_rows) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / cols;
    const bool full = full_rows && row % 7 == 3;
    const float u = unif(i, seed);
    if (kind == 1) {
      ((unsigned char*)p)[i] = !full && u < 0.75f;
    } else {
      float v = full || u < 0.1f ? __int_as_float(0xff800000) : normal(i, seed + 1);
      if (kind == 2)
        ((float*)p)[i] = v;
      else
        ((unsigned short*)p)[i] = f2h(v, kind == 4);
    }
  }
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct RefArgs {
  KfArgs a;
  float* out;  // [B, H, L, D] contiguous fp32
  int d;
};

// One block per (b*h, i): scores in shared memory, exact softmax, fp32; zeros if all -inf.
__global__ void ref_attention(RefArgs r) {
  extern __shared__ float sm[];
  const KfArgs& a = r.a;
  const int d = r.d, bf16 = a.cfg.bf16;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, hk = h / a.group;
  const int i = blockIdx.y;
  float* qrow = sm;
  float* sc = sm + d;
  __shared__ float red[32];
  const unsigned short* q = (const unsigned short*)a.q + b * a.q_b + h * a.q_h + i * a.q_r;
  const unsigned short* k = (const unsigned short*)a.k + b * a.k_b + hk * a.k_h;
  const unsigned short* v = (const unsigned short*)a.v + b * a.v_b + hk * a.v_h;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qrow[c] = h2f(q[c], bf16);
  __syncthreads();
  const float ninf = __int_as_float(0xff800000);
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) {
    float dot = 0.f;
    for (int c = 0; c < d; ++c) dot += qrow[c] * h2f(k[j * a.k_r + c], bf16);
    float x = dot * a.scale;
    if (a.cfg.causal && j > i) x = ninf;
    if (a.cfg.mask != 0) {
      const long long off = b * a.m_b + h * a.m_h + i * a.m_r + j * a.m_c;
      if (a.cfg.mask == 1) {
        if (((const unsigned char*)a.mask)[off] == 0) x = ninf;
      } else if (a.cfg.mask == 2) {
        x += ((const float*)a.mask)[off];
      } else {
        x += h2f(((const unsigned short*)a.mask)[off], a.cfg.mask == 4);
      }
    }
    sc[j] = x;
  }
  __syncthreads();
  float mx = ninf;
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) mx = fmaxf(mx, sc[j]);
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = ninf;
  for (int w = 0; w < blockDim.x / 32; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float* out = r.out + ((long long)bh * gridDim.y + i) * d;
  if (mx == ninf) {
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[c] = 0.f;
    return;
  }
  float sum = 0.f;
  for (int j = threadIdx.x; j < a.kv_len; j += blockDim.x) {
    sc[j] = expf(sc[j] - mx);
    sum += sc[j];
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < blockDim.x / 32; ++w) sum += red[w];
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < a.kv_len; ++j) acc += sc[j] * h2f(v[j * a.v_r + c], bf16);
    out[c] = acc / sum;
  }
}

// ---- host side ----------------------------------------------------------------------------------

float HostH2F(unsigned short h, int bf16) {
  if (bf16) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  const unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float f;
  if (e == 0)
    f = std::ldexp((float)m, -24);
  else if (e == 31)
    f = m ? NAN : INFINITY;
  else
    f = std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -f : f;
}

struct Variant {
  const char* name;
  int d, bm, bn, warps, qreg, minb, onesync;
};
// Candidate tilings per head dim; the first of each is kiln's PlanFlashAttention (keep in step).
const Variant kVariants[] = {
    {"A", 64, 128, 64, 4, 1, 2, 1},   {"A2", 64, 128, 64, 4, 1, 2, 0},
    {"B", 64, 128, 64, 4, 0, 2, 1},   {"D", 64, 64, 64, 4, 1, 3, 1},
    {"N", 64, 128, 128, 4, 0, 1, 1},  {"C", 64, 128, 64, 8, 1, 2, 1},
    {"F2", 128, 128, 64, 4, 0, 2, 0}, {"F", 128, 128, 64, 4, 0, 2, 1},
    {"I", 128, 128, 32, 4, 0, 2, 1},  {"I2", 128, 128, 32, 4, 0, 2, 0},
    {"G", 128, 64, 64, 4, 1, 2, 1},   {"H", 128, 128, 64, 8, 1, 1, 1},
};
const Variant& DefaultFor(int d) {
  for (const Variant& v : kVariants)
    if (v.d == d) return v;
  return kVariants[0];
}

KfConfig Cfg(const Variant& v, int bf16, int causal, int mask) {
  return KfConfig{v.d, v.bm, v.bn, v.warps, v.qreg, v.minb, bf16, causal, mask, v.onesync};
}

struct Case {
  const char* name;
  int b, h, hk, lq, lk, d;
  int causal = 0, mask = 0, full_rows = 0, bthd = 0;
  int mask_dims = 4;  // 4: [B,H,L,S]; 2: [L,S]; 1: key padding [B,1,1,S]; 5: column [L,1]
  float scale = 0;    // 0: 1/sqrt(d)
};

struct Buffers {
  unsigned short *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  void* mask = nullptr;
  float* ref = nullptr;
  KfArgs args{};
  size_t q_elems = 0;
  void Free() { cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(mask), cudaFree(ref); }
};

void Fill16(unsigned short* p, long long n, unsigned seed, int bf16) {
  if (n > 0) fill16<<<1024, 256>>>(p, n, seed, bf16);
}

// Allocates and fills a case's tensors and the launch arguments (strides per layout).
Buffers Make(const Case& c, int bf16, unsigned seed, bool with_ref) {
  Buffers b;
  const long long nq = (long long)c.b * c.h * c.lq * c.d, nk = (long long)c.b * c.hk * c.lk * c.d;
  CK(cudaMalloc(&b.q, nq * 2 + 16));
  CK(cudaMalloc(&b.o, nq * 2 + 16));
  CK(cudaMalloc(&b.k, nk * 2 + 16));
  CK(cudaMalloc(&b.v, nk * 2 + 16));
  Fill16(b.q, nq, seed, bf16), Fill16(b.k, nk, seed + 1, bf16), Fill16(b.v, nk, seed + 2, bf16);
  CK(cudaMemset(b.o, 0xff, nq * 2));  // NaN pattern: unwritten outputs show
  KfArgs& a = b.args;
  a.q = b.q, a.k = b.k, a.v = b.v, a.o = b.o;
  auto strides = [&](int heads, int len, long long* sb, long long* sh, long long* sr) {
    if (c.bthd)
      *sb = (long long)len * heads * c.d, *sh = c.d, *sr = (long long)heads * c.d;
    else
      *sb = (long long)heads * len * c.d, *sh = (long long)len * c.d, *sr = c.d;
  };
  strides(c.h, c.lq, &a.q_b, &a.q_h, &a.q_r);
  strides(c.hk, c.lk, &a.k_b, &a.k_h, &a.k_r);
  strides(c.hk, c.lk, &a.v_b, &a.v_h, &a.v_r);
  a.o_b = (long long)c.h * c.lq * c.d, a.o_h = (long long)c.lq * c.d, a.o_r = c.d;
  if (c.mask != 0) {
    long long mb = c.b, mh = c.h, ml = c.lq, ms = c.lk;
    if (c.mask_dims == 2) mb = 1, mh = 1;
    if (c.mask_dims == 1) mh = 1, ml = 1;
    if (c.mask_dims == 5) mb = 1, mh = 1, ms = 1;
    const int es = c.mask == 1 ? 1 : c.mask == 2 ? 4 : 2;
    const long long n = mb * mh * ml * ms;
    CK(cudaMalloc(&b.mask, n * es + 16));
    if (n > 0) fill_mask<<<1024, 256>>>(b.mask, n, ms, seed + 7, c.mask, c.full_rows);
    a.mask = b.mask;
    a.m_c = ms == 1 ? 0 : 1;
    a.m_r = ml == 1 ? 0 : ms;
    a.m_h = mh == 1 ? 0 : ml * ms;
    a.m_b = mb == 1 ? 0 : mh * ml * ms;
  }
  a.batch = c.b, a.heads = c.h, a.group = c.h / c.hk, a.q_len = c.lq, a.kv_len = c.lk;
  a.scale = c.scale != 0 ? c.scale : 1.f / std::sqrt((float)c.d);
  a.stream = nullptr;
  b.q_elems = nq;
  if (with_ref) {
    CK(cudaMalloc(&b.ref, nq * 4 + 16));
    RefArgs r{a, b.ref, c.d};
    r.a.cfg.bf16 = bf16, r.a.cfg.causal = c.causal, r.a.cfg.mask = c.mask;
    if (nq > 0) {
      ref_attention<<<dim3(c.b * c.h, c.lq), 128, (c.d + c.lk) * 4>>>(r);
      CK(cudaGetLastError());
    }
  }
  CK(cudaDeviceSynchronize());
  return b;
}

struct Check {
  double max_abs = 0, worst = 0;  // worst: |err| / (atol + rtol |ref|)
  long long bad = 0, nan = 0;
};

Check Compare(const Buffers& b, const Case& c, int bf16) {
  std::vector<unsigned short> got(b.q_elems);
  std::vector<float> want(b.q_elems);
  CK(cudaMemcpy(got.data(), b.o, b.q_elems * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want.data(), b.ref, b.q_elems * 4, cudaMemcpyDeviceToHost));
  const double atol = bf16 ? 2e-2 : 4e-3, rtol = atol;
  Check k;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = HostH2F(got[i], bf16), w = want[i];
    if (std::isnan(g) != std::isnan(w)) {
      ++k.nan, ++k.bad;
      continue;
    }
    const double err = std::fabs(g - w), r = err / (atol + rtol * std::fabs(w));
    k.max_abs = std::max(k.max_abs, err), k.worst = std::max(k.worst, r);
    if (r > 1) ++k.bad;
  }
  return k;
}

std::vector<Case> CorrectnessCases(bool small) {
  std::vector<Case> v = {
      {"tiny", 1, 1, 1, 1, 1, 64},
      {"basic", 2, 3, 3, 37, 45, 64},
      {"causal_sq", 1, 2, 2, 70, 70, 64, 1},
      {"causal_lq>lk", 1, 2, 2, 150, 20, 64, 1},
      {"causal_lq<lk", 1, 2, 2, 20, 183, 64, 1},
      {"one_query", 2, 2, 2, 1, 33, 64},
      {"one_key_causal", 2, 2, 2, 9, 1, 64, 1},
      {"no_keys", 1, 2, 2, 5, 0, 64},
      {"gqa", 2, 6, 2, 19, 125, 64},
      {"gqa_causal", 2, 4, 1, 133, 133, 128, 1},
      {"d128_ragged", 1, 3, 3, 65, 129, 128},
      {"d128_causal", 2, 1, 1, 130, 130, 128, 1},
      {"bool_2d", 2, 2, 2, 21, 67, 64, 0, 1, 0, 0, 2},
      {"bool_full_rows", 2, 2, 2, 45, 130, 64, 0, 1, 1, 0, 4},
      {"key_padding", 2, 3, 3, 12, 70, 128, 0, 1, 0, 0, 1},
      {"f32_inf_rows", 2, 2, 2, 66, 72, 64, 0, 2, 1, 0, 4},
      {"f16_add", 1, 3, 3, 17, 140, 128, 0, 3, 0, 0, 4},
      {"bf16_add_col", 1, 2, 2, 11, 13, 64, 0, 4, 0, 0, 5},
      {"bthd", 2, 3, 3, 129, 131, 64, 1, 0, 0, 1},
      {"bthd_d128", 1, 2, 2, 40, 40, 128, 0, 0, 0, 1},
      {"neg_scale", 1, 2, 2, 15, 26, 64, 1, 0, 0, 0, 4, -0.2f},
  };
  if (!small) {
    std::vector<Case> big = {
        {"long_causal", 1, 2, 2, 1024, 1024, 64, 1},
        {"long_ragged", 2, 8, 2, 1000, 1337, 128, 1},
        {"long_2049", 1, 1, 1, 2049, 2049, 64, 1},
        {"long_nc", 2, 4, 4, 777, 2048, 64},
        {"long_mask", 1, 4, 4, 513, 1031, 128, 0, 1, 1, 0, 4},
        {"bench_shape", 8, 16, 16, 1024, 1024, 64, 1},
        {"bench_d128", 8, 16, 16, 1024, 1024, 128, 1},
    };
    v.insert(v.end(), big.begin(), big.end());
  }
  return v;
}

int g_pass = 0, g_fail = 0;

void RunCheck(const Case& c, const KfConfig& cfg, Buffers& b, const char* vname) {
  b.args.cfg = cfg;
  CK(cudaMemset(b.o, 0xff, b.q_elems * 2));
  const int rc = kf_launch(&b.args);
  cudaError_t e = cudaDeviceSynchronize();
  if (rc != 0 || e != cudaSuccess) {
    printf("  %-16s %-3s %s c%d m%d: LAUNCH FAILED rc=%d %s %s\n", c.name, vname,
           cfg.bf16 ? "bf16" : "f16", cfg.causal, cfg.mask, rc, kf_error(), cudaGetErrorString(e));
    ++g_fail;
    if (e != cudaSuccess) exit(2);  // context is gone
    return;
  }
  const Check k = Compare(b, c, cfg.bf16);
  const bool ok = k.bad == 0;
  (ok ? g_pass : g_fail)++;
  printf(
      "  %-16s %-3s %-4s [%d,%d/%d,%d,%d,%d] c%d m%d: max_abs %.2e worst %.2f bad %lld nan %lld "
      "%s\n",
      c.name, vname, cfg.bf16 ? "bf16" : "f16", c.b, c.h, c.hk, c.lq, c.lk, c.d, cfg.causal,
      cfg.mask, k.max_abs, k.worst, k.bad, k.nan, ok ? "PASS" : "FAIL");
}

void Correctness(bool small) {
  printf("\n== correctness vs fp32 reference ==\n");
  for (const Case& c : CorrectnessCases(small)) {
    for (int bf16 : {1, 0}) {
      Buffers b = Make(c, bf16, 1234u + c.lq * 7 + c.lk, true);
      RunCheck(c, Cfg(DefaultFor(c.d), bf16, c.causal, c.mask), b, DefaultFor(c.d).name);
      if (!small && bf16 && c.mask == 0) {  // every tiling of this head dim
        for (const Variant& v : kVariants) {
          if (v.d != c.d || &v == &DefaultFor(c.d)) continue;
          RunCheck(c, Cfg(v, bf16, c.causal, 0), b, v.name);
        }
      }
      b.Free();
    }
  }
  printf("correctness: %d pass, %d fail\n", g_pass, g_fail);
}

void CompileAll(bool small) {
  std::vector<KfConfig> cfgs;
  for (int d : {64, 128})
    for (int bf16 : {1, 0})
      for (int causal : {0, 1})
        for (int mask = 0; mask <= 4; ++mask)
          cfgs.push_back(Cfg(DefaultFor(d), bf16, causal, mask));
  if (!small) {
    for (const Variant& v : kVariants)
      for (int causal : {0, 1}) cfgs.push_back(Cfg(v, 1, causal, 0));
  }
  const std::string arch = kf::Arch();
  std::vector<std::string> cubins(cfgs.size());
  std::vector<std::thread> pool;
  const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  for (unsigned t = 0; t < n_threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < cfgs.size();) cubins[i] = kf::CompileCubin(cfgs[i], arch);
    });
  }
  for (auto& t : pool) t.join();
  printf("\n== %zu variants compiled for %s ==\n", cfgs.size(), arch.c_str());
  for (size_t i = 0; i < cfgs.size(); ++i) {
    if (cubins[i].empty()) {
      printf("  COMPILE FAILED %s\n", kf::Name(cfgs[i]).c_str());
      ++g_fail;
      continue;
    }
    kf::Load(cfgs[i], &cubins[i]);
    int regs = -1, local = -1, blocks = -1;
    if (kf_info(&cfgs[i], &regs, &local, &blocks) != 0) {
      printf("  LOAD FAILED %s: %s\n", kf::Name(cfgs[i]).c_str(), kf_error());
      ++g_fail;
      continue;
    }
    if (cfgs[i].mask == 0 || cfgs[i].mask == 1)
      printf("  %-52s regs %3d local %4d B  CTAs/SM %d  smem %d\n", kf::Name(cfgs[i]).c_str(), regs,
             local, blocks, kf::SmemBytes(cfgs[i]));
  }
}

// Median device time per launch (us): chunks of launches queued behind a spin kernel so the GPU
// never waits for the host; inputs rotate over `sets`.
double TimeIt(std::vector<Buffers>& sets, const KfConfig& cfg, int reps) {
  const int chunk = 10;
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < 3; ++i) {
    sets[i % sets.size()].args.cfg = cfg;
    if (kf_launch(&sets[i % sets.size()].args) != 0) return -1;
  }
  for (int c0 = 0; c0 < reps; c0 += chunk) {
    spin<<<1, 1>>>(2000000);  // ~1 ms
    for (int i = c0; i < std::min(reps, c0 + chunk); ++i) {
      Buffers& b = sets[i % sets.size()];
      b.args.cfg = cfg;
      CK(cudaEventRecord(ev[2 * i]));
      kf_launch(&b.args);
      CK(cudaEventRecord(ev[2 * i + 1]));
    }
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2] * 1000.0;
}

void Timing() {
  printf("\n== timing (median us per launch, bf16) ==\n");
  struct Shape {
    int b, h, l, d, causal;
  };
  const Shape shapes[] = {{8, 16, 1024, 64, 1}, {8, 16, 1024, 64, 0},  {8, 16, 4096, 64, 1},
                          {8, 16, 4096, 64, 0}, {8, 16, 1024, 128, 1}, {8, 16, 1024, 128, 0}};
  for (const Shape& s : shapes) {
    const Case c{"bench", s.b, s.h, s.h, s.l, s.l, s.d, s.causal};
    const double set_bytes = 4.0 * s.b * s.h * s.l * s.d * 2;
    const int nsets = std::max(2, std::min(8, (int)std::ceil(1.5 * 50e6 / set_bytes)));
    std::vector<Buffers> sets;
    for (int i = 0; i < nsets; ++i) sets.push_back(Make(c, 1, 99u + i, false));
    const double flops = 4.0 * s.b * s.h * (double)s.l * s.l * s.d * (s.causal ? 0.5 : 1.0);
    for (const Variant& v : kVariants) {
      if (v.d != s.d) continue;
      const double us = TimeIt(sets, Cfg(v, 1, s.causal, 0), 40);
      printf("  [%d,%d,%d,%d] %-9s %-3s %-28s %9.1f us  %6.1f TFLOP/s\n", s.b, s.h, s.l, s.d,
             s.causal ? "causal" : "noncausal", v.name,
             kf::Name(Cfg(v, 1, s.causal, 0)).c_str() + 21, us, flops / us * 1e-6);
    }
    for (auto& b : sets) b.Free();
  }
}

int main(int argc, char** argv) {
  const bool small = argc > 1 && strcmp(argv[1], "--sanitize") == 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MB, smem/SM %zu KB\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20, prop.sharedMemPerMultiprocessor >> 10);
  CompileAll(small);
  Correctness(small);
  if (!small) Timing();
  printf("\nSUMMARY: %d pass, %d fail\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
