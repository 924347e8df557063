// Standalone launcher of kiln's flash attention kernel for the GPU harness: compiles the same
// source text kiln hands NVRTC (codegen/families/attention/flash_attention_source.h) with the same
// NVRTC options, loads it with cudaLibraryLoadData and launches it as kiln's LaunchFlashAttention
// does, but with every tiling parameter open (KfConfig), so tilings can be compared. A C API, so
// that bench.py calls it through ctypes; no kiln library, Abseil or torch needed to build it.
#pragma once
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "codegen/families/attention/flash_attention_source.h"  // -I <kiln repo root>

extern "C" {
struct KfConfig {
  int d, bm, bn, warps, qreg, minb, bf16, causal, mask, onesync;
};
struct KfArgs {
  KfConfig cfg;
  const void *q, *k, *v;
  void* o;
  const void* mask;
  long long q_b, q_h, q_r, k_b, k_h, k_r, v_b, v_h, v_r, o_b, o_h, o_r, m_b, m_h, m_r, m_c;
  int batch, heads, group, q_len, kv_len;
  float scale;
  void* stream;
};
}

namespace kf {

struct Params {  // KilnFlashParams
  const void *q, *k, *v;
  void* o;
  const void* mask;
  long long q_batch, q_head, q_row, k_batch, k_head, k_row, v_batch, v_head, v_row, o_batch, o_head,
      o_row, m_batch, m_head, m_row, m_col;
  int heads, group, q_len, kv_len;
  float scale_log2;
  int section;  // (batch, head) pairs run together: all of them, the row tiles in turn
};

inline std::string& LastError() {
  static thread_local std::string e;
  return e;
}

inline std::string Name(const KfConfig& c) {
  char buf[200];
  snprintf(buf, sizeof(buf), "kiln_flash_attention_d%d_%s%s%s_%dx%dw%d%s%s", c.d,
           c.bf16 ? "bf16" : "f16", c.causal ? "_causal" : "",
           c.mask == 0   ? ""
           : c.mask == 1 ? "_boolmask"
           : c.mask == 2 ? "_f32mask"
           : c.mask == 3 ? "_f16mask"
                         : "_bf16mask",
           c.bm, c.bn, c.warps, c.qreg ? "" : "s", c.onesync ? "" : "_2sync");
  return buf;
}

inline std::string Source(const KfConfig& c) {
  char defs[1000];
  snprintf(defs, sizeof(defs),
           "#define KILN_FA_NAME %s\n#define KILN_FA_HEAD_DIM %d\n#define KILN_FA_BLOCK_M %d\n"
           "#define KILN_FA_BLOCK_N %d\n#define KILN_FA_WARPS %d\n#define KILN_FA_Q_IN_REGS %d\n"
           "#define KILN_FA_MIN_BLOCKS %d\n#define KILN_FA_BF16 %d\n#define KILN_FA_CAUSAL %d\n"
           "#define KILN_FA_MASK %d\n#define KILN_FA_ONE_SYNC %d\n",
           Name(c).c_str(), c.d, c.bm, c.bn, c.warps, c.qreg, c.minb, c.bf16, c.causal, c.mask,
           c.onesync);
  // byte for byte what kiln's RenderFlashAttentionSource writes (tests/attention_test.cc checks)
  return "// " + Name(c) + ": kiln's flash attention forward\n" + defs +
         kiln::cuda_ops::kFlashParamsSource + kiln::cuda_ops::kFlashAttentionSource;
}

inline int SmemBytes(const KfConfig& c) { return (c.bm + 4 * c.bn) * c.d * 2; }

inline std::string Arch() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return "sm_" + std::to_string(major * 10 + minor);
}

// NVRTC -> cubin (thread-safe; no CUDA context needed). Empty string + LastError on failure.
inline std::string CompileCubin(const KfConfig& c, const std::string& arch) {
  const std::string src = Source(c), name = Name(c);
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, src.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "--std=c++17", "--fmad=true"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, 0);
    nvrtcGetProgramLog(prog, log.data());
    LastError() = "NVRTC failed for " + name + ": " + log;
    nvrtcDestroyProgram(&prog);
    return "";
  }
  size_t n = 0;
  nvrtcGetCUBINSize(prog, &n);
  std::string cubin(n, 0);
  nvrtcGetCUBIN(prog, cubin.data());
  nvrtcDestroyProgram(&prog);
  return cubin;
}

struct Loaded {
  cudaKernel_t kernel = nullptr;
  cudaLibrary_t lib = nullptr;
};

inline std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}
inline std::map<std::tuple<int, int, int, int, int, int, int, int, int, int>, Loaded>& Cache() {
  static std::map<std::tuple<int, int, int, int, int, int, int, int, int, int>, Loaded> m;
  return m;
}
inline auto Key(const KfConfig& c) {
  return std::make_tuple(c.d, c.bm, c.bn, c.warps, c.qreg, c.minb, c.bf16, c.causal, c.mask,
                         c.onesync);
}

// Loads a cubin compiled earlier (or compiles now). nullptr + LastError on failure.
inline cudaKernel_t Load(const KfConfig& c, const std::string* cubin_in = nullptr) {
  {
    std::lock_guard<std::mutex> lock(Mu());
    auto it = Cache().find(Key(c));
    if (it != Cache().end()) return it->second.kernel;
  }
  const std::string cubin = cubin_in != nullptr ? *cubin_in : CompileCubin(c, Arch());
  if (cubin.empty()) return nullptr;
  Loaded l;
  cudaError_t e =
      cudaLibraryLoadData(&l.lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e == cudaSuccess) e = cudaLibraryGetKernel(&l.kernel, l.lib, Name(c).c_str());
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(reinterpret_cast<const void*>(l.kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes(c));
  }
  if (e != cudaSuccess) {
    LastError() = std::string("loading ") + Name(c) + ": " + cudaGetErrorString(e);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(Mu());
  Cache()[Key(c)] = l;
  return l.kernel;
}

inline int Launch(const KfArgs* a) {
  const KfConfig& c = a->cfg;
  cudaKernel_t k = Load(c);
  if (k == nullptr) return 1;
  Params p{a->q,      a->k,
           a->v,      a->o,
           a->mask,   a->q_b,
           a->q_h,    a->q_r,
           a->k_b,    a->k_h,
           a->k_r,    a->v_b,
           a->v_h,    a->v_r,
           a->o_b,    a->o_h,
           a->o_r,    a->m_b,
           a->m_h,    a->m_r,
           a->m_c,    a->heads,
           a->group,  a->q_len,
           a->kv_len, static_cast<float>(a->scale * 1.4426950408889634)};
  p.section = a->batch * a->heads;
  dim3 grid(a->batch * a->heads, (a->q_len + c.bm - 1) / c.bm);
  void* args[] = {&p};
  cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(k), grid, dim3(c.warps * 32), args,
                                   SmemBytes(c), static_cast<cudaStream_t>(a->stream));
  if (e != cudaSuccess) {
    LastError() = std::string("launch ") + Name(c) + ": " + cudaGetErrorString(e);
    return 2;
  }
  return 0;
}

}  // namespace kf

extern "C" {
int kf_launch(const KfArgs* a) { return kf::Launch(a); }
const char* kf_error() { return kf::LastError().c_str(); }
// Registers, local (spill) bytes per thread, max threads; -1 on failure.
int kf_info(const KfConfig* c, int* regs, int* local_bytes, int* max_blocks_per_sm) {
  cudaKernel_t k = kf::Load(*c);
  if (k == nullptr) return -1;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k)) != cudaSuccess) return -1;
  *regs = attr.numRegs;
  *local_bytes = static_cast<int>(attr.localSizeBytes);
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(k),
                                                c->warps * 32, kf::SmemBytes(*c));
  *max_blocks_per_sm = blocks;
  return 0;
}
}
