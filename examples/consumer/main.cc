// A program that uses kiln the way a project outside kiln does: one include, one target. It
// builds a small MLP, runs it eagerly and compiled (on the CPU when there is no GPU) and prints
// the eager-vs-compiled report, saves its
// weights and loads them into another module, and passes a tensor through DLPack; it prints
// "consumer: OK" and exits 0 only when every result is what it should be.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "ops/ops.h"  // this project's own ops/ops.h, not kiln's

int main() {
  using namespace kiln;
  try {
    Generator gen(0);
    GeGLUMLP mlp(32, 64, gen);
    const Tensor x = randn({4, 32}, gen);
    const std::vector<double> eager = to_vector(mlp(x));
    CompiledFn f = compile(mlp, x);
    const std::vector<double> compiled = to_vector(f({x})[0]);
    double worst = 0;
    for (size_t i = 0; i < eager.size(); ++i)
      worst = std::max(worst, std::fabs(eager[i] - compiled[i]));

    const std::string path = "consumer_mlp.safetensors";
    save_state_dict(mlp, path);
    Generator other(1);
    GeGLUMLP copy(32, 64, other);
    const LoadReport report = load_state_dict(copy, path);
    std::remove(path.c_str());
    const bool same_after_load = to_vector(copy(x)) == eager;

    // The eager-vs-compiled report, one library call (on the CPU: wall and host time only).
    const ComparisonReport compared = CompareEagerAndCompiled(
        [&mlp](const std::vector<Tensor>& in) { return std::vector<Tensor>{mlp(in[0])}; }, {x});
    const std::string table = compared.ToString();
    std::cout << table;
    const bool reported = compared.others.size() == 1 && compared.others[0].wall_us_per_step > 0 &&
                          table.find("compiled") != std::string::npos;

    DLManagedTensor* exported = to_dlpack(x);
    const bool zero_copy = from_dlpack(exported).data_ptr() == x.data_ptr();

    std::cout << "eager vs compiled: max |diff| " << worst << "\n"
              << "loaded " << report.loaded.size() << " tensors, same output: " << same_after_load
              << "\n"
              << "dlpack zero-copy: " << zero_copy << ", own ops/ops.h: " << consumer::Twice(21)
              << "\n";
    if (worst > 1e-4 || !same_after_load || !zero_copy || !reported || consumer::Twice(21) != 42) {
      std::cout << "consumer: FAILED\n";
      return 1;
    }
  } catch (const kiln::Error& e) {
    std::cerr << "consumer: kiln::Error: " << e.what() << "\n";
    return 1;
  }
  std::cout << "consumer: OK\n";
  return 0;
}
