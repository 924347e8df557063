// CausalLM's cache allocation (see causal_lm.h).
#include "models/causal_lm.h"

#include "ops/factories.h"
#include "runtime/status.h"

namespace kiln {

KvCache CausalLM::NewCache(int64_t batch, int64_t capacity) const {
  const CacheSpec spec = cache_spec();
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
