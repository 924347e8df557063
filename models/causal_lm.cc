// CausalLM's cache allocation (see causal_lm.h).
#include "models/causal_lm.h"

#include "ops/factories.h"
#include "runtime/status.h"

namespace kiln {

CausalLM::CacheSpec CausalLM::CheckedCacheSpec(const char* who) const {
  const CacheSpec spec = cache_spec();
  KILN_CHECK(
      spec.layers >= 0 && spec.kv_heads > 0 && spec.head_dim > 0 && spec.vocab > 0 &&
          spec.max_positions > 0,
      who, ": ", type_name(), "::cache_spec() must give layers >= 0 and kv_heads, head_dim, ",
      "vocab, max_positions > 0, got layers=", spec.layers, " kv_heads=", spec.kv_heads,
      " head_dim=", spec.head_dim, " vocab=", spec.vocab, " max_positions=", spec.max_positions);
  KILN_CHECK(IsFloatingPoint(spec.dtype), who, ": ", type_name(),
             "::cache_spec() must give a floating dtype for the cache, got ",
             DTypeName(spec.dtype));
  return spec;
}

KvCache CausalLM::NewCache(int64_t batch, int64_t capacity) const {
  const CacheSpec spec = CheckedCacheSpec("NewCache");
  KILN_CHECK(batch > 0 && capacity > 0, type_name(), "::NewCache: batch and capacity must be ",
             "positive, got batch=", batch, " capacity=", capacity);
  KvCache cache;
  for (int64_t i = 0; i < spec.layers; ++i) {
    for (auto* list : {&cache.k, &cache.v}) {
      list->push_back(
          zeros({batch, spec.kv_heads, capacity, spec.head_dim}, spec.dtype, spec.device));
    }
  }
  return cache;
}

}  // namespace kiln
