// The public op API of kiln: free functions over Tensors, with torch's semantics.
//
//   using namespace kiln;
//   Tensor h = gelu(matmul(x, transpose(w, 0, 1)), "tanh") * u;
//   Tensor p = softmax(masked_fill(s, mask, -INFINITY), -1);
//
// Every function dispatches through the op registry (ops/dispatch.h), so it runs eagerly on
// CPU or CUDA, or records into a graph while tracing. Bad input throws kiln::Error naming the
// op, the operands and the rule broken.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/op_def.h"
#include "runtime/random.h"
#include "runtime/scalar.h"
#include "runtime/status.h"  // kiln::Error, thrown by every op on bad input

namespace kiln {

// Elementwise math (float32 compute for half types; integer inputs promote to float32).
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, std::string_view approximate = "none");  // "none" | "tanh"
Tensor silu(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);

// Arithmetic with numpy broadcasting and torch's type promotion; scalar forms too.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
// torch.div with rounding_mode "trunc" (toward zero; integers exactly) or "floor" (floor_divide).
Tensor div(const Tensor& a, const Tensor& b, std::string_view rounding_mode);
// a + alpha b and a - alpha b (torch's alpha; an integer result needs an integer alpha);
// half operands compute in float32 and round once.
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& x);

// Selection.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// A number for either branch, typed as torch types a Python number (where(m, x_bf16, 0.0) is
// bfloat16; an integer x with 0.5 is float32).
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

// In place (torch's trailing underscore): self must not be a broadcast view and keeps its shape.
const Tensor& add_(const Tensor& self, const Tensor& other);
const Tensor& add_(const Tensor& self, Scalar other);
const Tensor& mul_(const Tensor& self, const Tensor& other);
const Tensor& mul_(const Tensor& self, Scalar other);
const Tensor& masked_fill_(const Tensor& self, const Tensor& mask, Scalar value);
// self = src (src broadcast to self's shape, converted to self's dtype), like Tensor.copy_.
const Tensor& copy_(const Tensor& self, const Tensor& src);

// Reductions over `dims` (empty = all dims).
Tensor sum(const Tensor& x, IntList dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, IntList dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, IntList dims = {}, bool keepdim = false);  // values (torch.amax)
// The product (torch.prod): integers and bools give int64 (wrapping), floats keep their dtype;
// an empty reduction gives 1.
Tensor prod(const Tensor& x, IntList dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Normalise over the last dim; weight/bias may be undefined (Tensor()).
Tensor layer_norm(const Tensor& x, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight = {}, double eps = 1e-6);

// Matrix products: torch.matmul semantics (1-D, 2-D, broadcast batches); linear = x @ wᵀ + b.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// float32 matmuls on CUDA may use TF32 tensor cores when allowed (default: false, like
// torch.backends.cuda.matmul.allow_tf32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// Views (metadata only, no copy) and layout.
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor t(const Tensor& x);  // transpose of a matrix (rank <= 2)
Tensor permute(const Tensor& x, IntList dims);
Tensor reshape(const Tensor& x, IntList shape);  // a view when possible, else a copy
Tensor view(const Tensor& x, IntList shape);     // a view, or an error
Tensor expand(const Tensor& x, IntList shape);   // -1 keeps a dim
Tensor broadcast_to(const Tensor& x, IntList shape);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);

// Attention: torch.nn.functional.scaled_dot_product_attention (without dropout).
// q [..., L, E], k [..., S, E], v [..., S, Ev] -> [..., L, Ev] = softmax(q·kᵀ·scale + mask)·v,
// scale defaulting to 1/sqrt(E). The batch dims of q, k and v must be equal, except the heads
// (dim -3) with enable_gqa, where k/v heads divide q heads (q head h reads k/v head h / (Hq/Hk)).
// attn_mask broadcasts to [..., L, S]: bool (true = take part, as torch) or additive (float32
// or q's dtype). is_causal keeps key j for query i iff j <= i (top-left aligned, torch's
// tril(ones(L, S))); with an attn_mask it is an error, as in torch. A query row with every score
// -inf (fully masked) gives zeros, as torch's SDPA does. Views of [B, T, H, D] tensors transposed
// to [B, H, T, D] are read in place. The backend (below) is chosen per call.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = {}, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    bool enable_gqa = false);

// Attention backends, like torch.nn.attention.SDPBackend:
//   kMath   the math form composed of kiln ops (matmul, scale, mask, softmax, matmul);
//   kFlash  kiln's fused flash attention kernel (CUDA; bf16/f16, head dims 64 and 128);
//   kAuto   flash where it supports the inputs, else math (on CPU: the CPU reference kernel).
enum class SdpaBackend : uint8_t { kAuto, kMath, kFlash };
const char* SdpaBackendName(SdpaBackend b);  // "auto", "math", "flash"

// The backend a call with these arguments runs under the current guard, and why; throws
// kiln::Error for bad input (as the call would) and when the guard demands flash but flash cannot
// run them (the reason says why).
struct SdpaBackendChoice {
  SdpaBackend backend;
  std::string reason;
};
SdpaBackendChoice sdpa_backend_choice(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& attn_mask = {}, bool is_causal = false,
                                      std::optional<double> scale = std::nullopt,
                                      bool enable_gqa = false);

// Picks the backend of scaled_dot_product_attention calls on this thread for the guard's
// lifetime (torch.nn.attention.sdpa_kernel); guards nest. Compiled functions read it when they
// run, not when they are traced.
class SdpaBackendGuard {
 public:
  explicit SdpaBackendGuard(SdpaBackend backend);
  ~SdpaBackendGuard();
  SdpaBackendGuard(const SdpaBackendGuard&) = delete;
  SdpaBackendGuard& operator=(const SdpaBackendGuard&) = delete;

 private:
  SdpaBackend prev_;
};
SdpaBackend current_sdpa_backend();
// More math (torch semantics; integer operands compute exactly in integers on the CPU).
Tensor abs(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor erf(const Tensor& x);
// Rounding to integral values (the dtype kept; integer tensors pass unchanged, bool refused);
// round is half to even, as torch.round.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor log1p(const Tensor& x);  // log(1 + x), accurate near 0
Tensor expm1(const Tensor& x);  // exp(x) - 1, accurate near 0
Tensor tan(const Tensor& x);
Tensor atan(const Tensor& x);
// More of torch's unary math: integers and bools give float32, as torch's.
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
Tensor exp2(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
// The angle of the point (x, y) in (-pi, pi], broadcasting (torch.atan2(y, x)).
Tensor atan2(const Tensor& y, const Tensor& x);
Tensor reciprocal(const Tensor& x);  // 1 / x; integers give float32
Tensor sign(const Tensor& x);        // -1, 0 or 1 in x's dtype (NaN: 0); bool unchanged
// Division with rounding, broadcasting and promoting like add (bool refused), exact on integers:
// remainder is Python's % (the result takes the divisor's sign), fmod C's (the dividend's),
// floor_divide the quotient rounded down (torch's div rounding_mode="floor"). An integer
// divisor of 0 is an error on the CPU (torch's ZeroDivisionError) and gives -1 on CUDA, where
// torch gives whatever the hardware gives; a floating one gives NaN or ±inf.
// Running sums along `dim` (torch.cumsum): floating inputs keep their dtype, integer and bool
// ones give int64. On CUDA floats are summed in float32 (on the CPU in double, as torch's).
Tensor cumsum(const Tensor& x, int64_t dim);
Tensor remainder(const Tensor& x, const Tensor& y);
Tensor remainder(const Tensor& x, Scalar y);
Tensor fmod(const Tensor& x, const Tensor& y);
Tensor fmod(const Tensor& x, Scalar y);
Tensor floor_divide(const Tensor& x, const Tensor& y);
Tensor floor_divide(const Tensor& x, Scalar y);
Tensor pow(const Tensor& x, const Tensor& exponent);  // broadcasting; int ** negative int: 0, ±1
Tensor pow(const Tensor& x, Scalar exponent);         // an int tensor ** negative int: an error
Tensor pow(Scalar base, const Tensor& exponent);      // torch.pow(2, x): types as torch's
Tensor minimum(const Tensor& a, const Tensor& b);     // NaN propagates
Tensor maximum(const Tensor& a, const Tensor& b);
// clamp with either bound (std::nullopt: none); a NaN bound or value gives NaN, min > max gives
// max, like torch. Tensor bounds broadcast (maximum, then minimum).
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt);
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max);
Tensor clamp_min(const Tensor& x, Scalar min);
Tensor clamp_max(const Tensor& x, Scalar max);

// Comparisons: bool results, broadcasting, compared in torch's common dtype (a scalar is first
// rounded to a floating tensor's dtype, so bf16 x == 0.1 compares with bf16(0.1)).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, Scalar b);
Tensor operator!=(const Tensor& a, Scalar b);
Tensor operator<(const Tensor& a, Scalar b);
Tensor operator<=(const Tensor& a, Scalar b);
Tensor operator>(const Tensor& a, Scalar b);
Tensor operator>=(const Tensor& a, Scalar b);

// Indexing with int64 or int32 indices (ops/indexing_ops.cc). An index outside the indexed dim
// throws kiln::Error naming the op, the index and its position, on CUDA too (the CUDA kernels
// then wait for the stream: see ops/cuda/index_cuda.h). Negative indices are out of range.
Tensor embedding(const Tensor& indices, const Tensor& weight);           // weight [V, D] -> [*, D]
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index 1-D
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);  // out[i][j] = x[index[i][j]][j]
// torch.index_copy: self with self.select(dim, index[i]) = source.select(dim, i); source has
// self's shape but index.numel() slices along dim, and self's dtype. Repeated indices: one of
// the writes wins (which one is unspecified on CUDA, as in torch). index_copy_ writes self in
// place (on CUDA only the indexed slices move, after the indices are checked).
Tensor index_copy(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source);
const Tensor& index_copy_(const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& source);
// torch.scatter: self with out[index[i][j]][j] = src[i][j] (dim 0; likewise in any dim and rank).
// index, self and src have one rank; index is no larger than src in any dim and no larger than
// self but along dim; src has self's dtype. Repeated indices: one of the writes wins (which one
// is unspecified on CUDA, as in torch). Every index is checked before any is written.
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, Scalar value);
// The same with += (torch.scatter_add): repeated indices accumulate (on CUDA by atomics, in an
// order that may change the last bits of floating sums; bool is refused there).
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// In place: self is written (only the indexed elements move).
const Tensor& scatter_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
const Tensor& scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);

// Joining copies (types promote); splitting returns views (slices of x), like torch.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);  // cat of unsqueezed views
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& x, IntList sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// Selection. NaN counts as the largest value; ties go to the lowest index.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// The index of the smallest element (the first among equal ones, a NaN's if there is one), as
// torch.argmin; bool and integer tensors exactly.
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
struct ValuesIndices {
  Tensor values, indices;  // indices are int64
};
// torch.max(x, dim): values (the `max` row) and indices (the `argmax` row), two dispatches.
ValuesIndices max_with_indices(const Tensor& x, int64_t dim, bool keepdim = false);
// The k largest (smallest) along dim, sorted: indices from the `topk` row, values gathered.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

// The value of a one-element tensor (torch's .item()), copied to the host: double, float,
// int64_t (exact for int64 tensors), int32_t or bool. A floating value becomes an integer toward
// zero. Throws for other sizes, meta tensors, traced values, and (as libtorch's item<T>()) a NaN,
// an infinity or a value outside T's range asked for as an integer.
template <typename T = double>
T item(const Tensor& x);

// Composites with torch's names and semantics, built from the ops above (they launch what those
// launch and are traced as them; ops/composite_ops.cc). Bad arguments throw naming the function.
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);  // 0-d: [1]
Tensor unflatten(const Tensor& x, int64_t dim, IntList sizes);                 // one size may be -1
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);    // a view
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim);
Tensor repeat_interleave(const Tensor& x, int64_t repeats);  // of the flattened x
Tensor repeat(const Tensor& x, IntList repeats);             // torch.Tensor.repeat (tiles)
Tensor min(const Tensor& x, IntList dims = {}, bool keepdim = false);  // values (torch.amin)
// log(sum(exp(x))) over `dims`, stably (a row of -inf gives -inf, one with +inf gives +inf);
// integer and bool inputs give float32.
Tensor logsumexp(const Tensor& x, IntList dims, bool keepdim = false);
// Variance over `dims` (empty = all) with Bessel's `correction`: sum((x - mean)^2) / (N -
// correction); N - correction <= 0 gives inf or nan, as in torch. Floating x only.
Tensor var(const Tensor& x, IntList dims = {}, int64_t correction = 1, bool keepdim = false);
// The standard deviation, sqrt(var(...)) (torch.std). Call it as kiln::std: after `using
// namespace kiln`, a bare std(x) is ambiguous with namespace std (as torch::std is).
Tensor std(const Tensor& x, IntList dims = {}, int64_t correction = 1, bool keepdim = false);
// The vector p-norm over `dims` (empty = all; torch.linalg.vector_norm): (sum |x|^p)^(1/p), the
// largest |x| for p = inf, the smallest for -inf, the count of nonzeros for 0. Floating x only;
// half types compute in float32 and round once.
Tensor norm(const Tensor& x, double p = 2, IntList dims = {}, bool keepdim = false);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's softplus).
Tensor softplus(const Tensor& x, double beta = 1, double threshold = 20);
// x sorted along `dim` (torch.sort, stable): ascending, or descending; NaN counts as the
// largest value. Values and their int64 indices in x.
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
// x with the order of each of `dims` reversed (a copy, as torch.flip).
Tensor flip(const Tensor& x, IntList dims);
// x rolled by shifts[i] along dims[i] (elements past the end come back at the start); with no
// dims, the flattened x rolled and reshaped back (torch.roll).
Tensor roll(const Tensor& x, IntList shifts, IntList dims = {});
// int64 [..., num_classes] with a 1 at each index (torch.nn.functional.one_hot); num_classes -1:
// the largest index + 1 (read on the host: not inside a compiled function). An index outside
// [0, num_classes) is an error.
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);
// Activations (torch.nn.functional's), floating x only; half inputs compute in float32 and
// round once, as torch's kernels do.
Tensor elu(const Tensor& x, double alpha = 1);  // x > 0 ? x : alpha (exp(x) - 1)
Tensor hardtanh(const Tensor& x, double min_val = -1, double max_val = 1);
Tensor relu6(const Tensor& x);        // hardtanh(x, 0, 6)
Tensor hardsigmoid(const Tensor& x);  // relu6(x + 3) / 6
Tensor hardswish(const Tensor& x);    // x relu6(x + 3) / 6
Tensor mish(const Tensor& x);         // x tanh(softplus(x))
Tensor logsigmoid(const Tensor& x);   // log(sigmoid(x)) = -softplus(-x)
// a sigmoid(b) for the two halves a, b of `dim` (its size must be even).
Tensor glu(const Tensor& x, int64_t dim = -1);
// x / max(||x||_p, eps) along dim (F.normalize).
Tensor normalize(const Tensor& x, double p = 2, int64_t dim = 1, double eps = 1e-12);
// sum over dim of (a / max(||a||, eps)) (b / max(||b||, eps)), broadcasting a and b
// (F.cosine_similarity).
Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim = 1, double eps = 1e-8);
// beta input + alpha (a @ b) for 2-D a and b (torch.addmm); beta = 0 ignores input (NaN too).
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta = 1,
             Scalar alpha = 1);
// torch.einsum: subscripts per operand ("bhid,bhjd->bhij", "ij,jk", "...ij->...ji"), letters and
// one "..." each; without "->" the output is the ellipsis and then the letters seen once, in
// order. Sizes of one subscript must agree or be 1. Contracted pairwise left to right, each pair
// one matmul (ops/einsum.cc). A subscript repeated within one operand (a diagonal) is an error.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);
// a[i] * b[j] for 1-D a and b: [len(a), len(b)].
Tensor outer(const Tensor& a, const Tensor& b);
// The cross-entropy of `logits` (classes along dim 1: [N, C], [N, C, d1, ...], or [C]) against
// class indices `target` ([N], [N, d1, ...] or [], integer): logsumexp(logits) - the target's
// logit, per element; elements whose target is ignore_index count for nothing. reduction "mean"
// (over the elements not ignored; NaN when all are), "sum" or "none" (target's shape). Computed
// in float32 for half logits, the result in the logits' dtype. A target outside [0, C) is an
// error naming it.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     std::string_view reduction = "mean");
// Classification losses over class indices, like cross_entropy: nll_loss takes log-probabilities
// (torch.nn.functional.nll_loss: -input[target]).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                std::string_view reduction = "mean");
// Pointwise losses (torch.nn.functional's, ops/loss_ops.cc): floating input and target, which
// broadcast (the binary cross-entropies need one shape, as torch); reduction "mean", "sum" or
// "none"; half inputs compute in float32 and the result is rounded once.
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: l1_loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      std::string_view reduction = "mean", double beta = 1.0);
// 0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta); delta > 0.
Tensor huber_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean",
                  double delta = 1.0);
// -(t log x + (1 - t) log(1 - x)) for probabilities x, each log clamped at -100 (torch's);
// values of x outside [0, 1] give NaN (torch's CPU kernel refuses them, which needs the data).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            std::string_view reduction = "mean");
// The same on logits, computed stably; pos_weight (broadcasting to the input) weighs the
// positive term.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        std::string_view reduction = "mean",
                                        const Tensor& pos_weight = {});
// target (log target - input) for log-probabilities `input` (0 where target is 0); log_target:
// targets given as logs. reduction may also be "batchmean" (the sum over input.size(0)).
Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction = "mean",
              bool log_target = false);
// More math (ops/composite_math.cc).
Tensor square(const Tensor& x);  // x * x; bool gives int64
// start + weight (end - start), as torch.lerp (floating operands, broadcasting).
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight);
Tensor addcmul(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value = 1);
Tensor addcdiv(const Tensor& input, const Tensor& t1, const Tensor& t2, Scalar value = 1);
Tensor logaddexp(const Tensor& a, const Tensor& b);  // log(exp(a) + exp(b)), stably
Tensor hypot(const Tensor& a, const Tensor& b);      // sqrt(a^2 + b^2) without overflow
// Batched products of 3-D [B, n, k] and [B, k, m] (no broadcasting, as torch.bmm), and
// beta input + alpha bmm(a, b) (beta = 0 ignores input).
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor baddbmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta = 1,
               Scalar alpha = 1);
// Activations (floating x; half inputs compute in float32).
Tensor selu(const Tensor& x);
Tensor celu(const Tensor& x, double alpha = 1);  // x > 0 ? x : alpha (exp(x / alpha) - 1)
Tensor softsign(const Tensor& x);                // x / (1 + |x|)
Tensor tanhshrink(const Tensor& x);              // x - tanh(x)
Tensor threshold(const Tensor& x, double threshold, double value);  // x > threshold ? x : value
Tensor softmin(const Tensor& x, int64_t dim);                       // softmax(-x, dim)
// The number of nonzero elements over `dims` (empty = all): int64.
Tensor count_nonzero(const Tensor& x, IntList dims = {});
// x with dims source[i] moved to destination[i], the others in their order (a view).
Tensor movedim(const Tensor& x, IntList source, IntList destination);
// torch.tile: repeat with reps padded by leading 1s when x has more dims.
Tensor tile(const Tensor& x, IntList reps);
// NaN, +inf and -inf replaced (by default 0 and the dtype's largest and lowest finite values).
Tensor nan_to_num(const Tensor& x, double nan = 0, std::optional<double> posinf = std::nullopt,
                  std::optional<double> neginf = std::nullopt);
// The n x m identity (m defaults to n).
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, DType dtype = DType::kFloat32,
           Device device = kCPU);
// `steps` evenly spaced values from start to end inclusive (torch.linspace).
Tensor linspace(double start, double end, int64_t steps, DType dtype = DType::kFloat32,
                Device device = kCPU);
// Zeroes elements with probability p and scales the rest by 1 / (1 - p) when training (else x
// itself), drawing from `gen` (so not inside a compiled function, as rand).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// Layout and indexing (ops/composite_layout.cc). select: x indexed at `index` along dim (a
// view without that dim; a negative index counts from the end); unbind: every such view.
Tensor select(const Tensor& x, int64_t dim, int64_t index);
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
Tensor swapaxes(const Tensor& x, int64_t a, int64_t b);  // transpose
// torch.nn.functional.pad, constant mode: pads = (left, right) of the last dim, then of the one
// before, ...; negative sizes crop. A new tensor.
Tensor pad(const Tensor& x, IntList pads, double value = 0);
// Views of 0-d or 1-D tensors expanded to their grid (torch.meshgrid; "xy": the first two dims
// swapped).
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing = "ij");
// self with alpha source's slices added at index along dim (repeats add up), and self with
// value written at the slices index names (torch.index_add, index_fill).
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                 Scalar alpha = 1);
Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, Scalar value);
// Products with torch's shape rules: [n, k] x [k, m], [n, k] x [k], [k] . [k] (one dtype).
Tensor mm(const Tensor& a, const Tensor& b);
Tensor mv(const Tensor& a, const Tensor& v);
Tensor dot(const Tensor& a, const Tensor& b);
// Data-dependent selection (ops/composite_select.cc): the truth values are read on the host, so
// these run eagerly (inside a function being compiled they are an error, as reading data is).
Tensor nonzero(const Tensor& x);   // int64 [n, rank]: the indices of the nonzero elements
Tensor argwhere(const Tensor& x);  // the same (torch.argwhere)
// The elements of x where the bool mask (broadcasting with x) is true, flattened: 1-D.
Tensor masked_select(const Tensor& x, const Tensor& mask);
// |a - b| <= atol + rtol |b| elementwise, or equal (infinities of one sign too); NaN is close to
// NaN only with equal_nan. a and b have one dtype, as in torch. allclose: all of them.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
               bool equal_nan = false);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);  // the same shape and equal elements
// The diagonal of dims dim1, dim2 (offset above it when positive, below when negative) as the
// last dim of a new tensor (a copy, where torch returns a view).
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// 1-D x: the square matrix with x on diagonal `offset`; 2-D x: diagonal(x, offset).
Tensor diag(const Tensor& x, int64_t offset = 0);
Tensor trace(const Tensor& x);  // the sum of a 2-D tensor's diagonal
// Truth values (torch's): nonzero is true, NaN too; bool results, broadcasting, any dtypes.
Tensor logical_not(const Tensor& x);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
// ~, &, |, ^ on bool tensors (torch's bitwise ops on masks); other dtypes are an error.
Tensor operator~(const Tensor& x);
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator^(const Tensor& a, const Tensor& b);
// remainder (Python's %: the result takes the divisor's sign).
Tensor operator%(const Tensor& a, const Tensor& b);
Tensor operator%(const Tensor& a, Scalar b);
Tensor operator%(Scalar a, const Tensor& b);
// Element predicates: bool results (integers are never NaN or infinite).
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isfinite(const Tensor& x);
// Whether any / all elements over `dims` (empty = all) are true (nonzero): bool results; an
// empty reduction gives false / true, as torch.
Tensor any(const Tensor& x, IntList dims = {}, bool keepdim = false);
Tensor all(const Tensor& x, IntList dims = {}, bool keepdim = false);
Tensor zeros_like(const Tensor& x);  // x's shape, dtype and device
Tensor ones_like(const Tensor& x);
Tensor full_like(const Tensor& x, Scalar value);
Tensor empty_like(const Tensor& x);

// Conversions.
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);
Tensor clone(const Tensor& x);  // a contiguous copy that owns its memory

}  // namespace kiln
