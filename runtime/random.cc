// The default generator of runtime/random.h: one Generator behind a mutex.
#include "runtime/random.h"

#include <mutex>

namespace kiln {
namespace {

std::mutex& DefaultMutex() {
  static std::mutex mu;
  return mu;
}

Generator& DefaultGenerator() {
  static Generator gen(0);
  return gen;
}

}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(DefaultMutex());
  DefaultGenerator() = Generator(seed);
}

void WithDefaultGenerator(const std::function<void(Generator&)>& fn) {
  std::lock_guard<std::mutex> lock(DefaultMutex());
  fn(DefaultGenerator());
}

}  // namespace kiln
