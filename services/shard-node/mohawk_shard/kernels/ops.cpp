// The kernels as torch ops (`torch.ops.mohawk.*`), registered when library.py calls
// mohawk_register_ops() on the build this process runs.
//
// A kernel reached from Python through ctypes paid about 8 µs a call in argument conversion and
// the wrapper's checks, and inside a TorchScript trace a Python callback on top: more than the
// arithmetic of most of a decode step's 212 calls. As ops, eager Python reaches them through the
// dispatcher (under 2 µs) and a traced step with no Python at all. The checks are the wrappers'
// (a ValueError for a bad shape or dtype). Registration is a call, not a static initializer, so a
// process can load several builds (the tests compare the AVX2 and AVX-512 builds' bits through
// their C functions) and register only one.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cstdint>

extern "C" {
void mohawk_int4_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint16_t* scales,
                         const uint16_t* mins, int64_t N, float* y, int num_threads);
void mohawk_q4k_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint8_t* subs,
                        const uint16_t* supers, int64_t N, float* y, int num_threads);
int mohawk_int8_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint16_t* scales,
                        const uint16_t* mins, const int8_t* subs, int32_t offset, int64_t N, float* y,
                        int num_threads);
void mohawk_rms_norm_rows(const float* x, int64_t M, int64_t N, const float* w, float eps, float* y,
                          int num_threads);
void mohawk_attend_rows(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D, const float* k,
                        const float* v, int64_t KVH, int64_t L, int64_t sh, int64_t sl, const int64_t* slots,
                        const float* mask, float scale, float* out, int num_threads);
void mohawk_attend_rows_f16(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D, const uint16_t* k,
                            const uint16_t* v, int64_t KVH, int64_t L, int64_t sh, int64_t sl, const int64_t* slots,
                            const float* mask, float scale, float* out, int num_threads);
void mohawk_top_rows(const float* x, int64_t M, int64_t V, int64_t k, int64_t* out, int num_threads);
}

namespace {

template <typename T>
const T* as(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}

// float32 rows x [M, K] times a packed weight (int4_rows.py `pack`: codes [N/16, K/8, 16] int32,
// scales and mins [N/16, K/32, 16] float16) -> float32 [M, n].
at::Tensor int4_rows_mm(const at::Tensor& rows, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& mins, int64_t n) {
  const int64_t in_features = codes.size(1) * 8;
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat && rows.dim() == 2 && rows.size(1) == in_features,
                    "int4_rows: float32 rows of ", in_features, ", got ", rows.scalar_type(), " ", rows.sizes());
  TORCH_CHECK_VALUE(codes.is_contiguous() && scales.is_contiguous() && mins.is_contiguous() &&
                        codes.size(0) * 16 == n && scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf,
                    "int4_rows: a weight not in the packed layout for ", n, " outputs");
  const at::Tensor x = rows.contiguous();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) > 0)
    mohawk_int4_rows_mm(as<float>(x), x.size(0), in_features, as<uint32_t>(codes), as<uint16_t>(scales),
                        as<uint16_t>(mins), n, y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

// float32 rows x [M, K] times a Q4_K weight in its layout (q4k_rows.py: codes [N/16, K/8, 16] int32,
// subs [N/16, K/64, 64] uint8, supers [N/16, K/256, 32] float16) -> float32 [M, n].
at::Tensor q4k_rows_mm(const at::Tensor& rows, const at::Tensor& codes, const at::Tensor& subs,
                       const at::Tensor& supers, int64_t n) {
  const int64_t in_features = codes.size(1) * 8;
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat && rows.dim() == 2 && rows.size(1) == in_features,
                    "q4k_rows: float32 rows of ", in_features, ", got ", rows.scalar_type(), " ", rows.sizes());
  TORCH_CHECK_VALUE(codes.is_contiguous() && subs.is_contiguous() && supers.is_contiguous() && codes.size(0) * 16 == n &&
                        in_features % 256 == 0 && subs.scalar_type() == at::kByte && supers.scalar_type() == at::kHalf &&
                        subs.numel() == n * in_features / 32 * 2 && supers.numel() == n * in_features / 256 * 2,
                    "q4k_rows: a weight not in the Q4_K layout for ", n, " outputs");
  const at::Tensor x = rows.contiguous();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) > 0)
    mohawk_q4k_rows_mm(as<float>(x), x.size(0), in_features, as<uint32_t>(codes), as<uint8_t>(subs),
                       as<uint16_t>(supers), n, y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

// float32 rows x [M, K] times a packed 5-to-8-bit weight (int8_rows.py `pack`: codes [N/16, K/4, 16]
// int32 (Q6_K: [N/16, K/8 + K/16, 16]), scales float16 [N/16, K/32 or K/256, 16], mins float16 [N/16, K/32, 16] or none, subs int8
// [N/16, K/16, 16] or none, codes shifted up by `offset`) -> float32 [M, n].
at::Tensor int8_rows_mm(const at::Tensor& rows, const at::Tensor& codes, const at::Tensor& scales,
                        const std::optional<at::Tensor>& mins, const std::optional<at::Tensor>& subs, int64_t n,
                        int64_t offset) {
  // a column's words: K/4 a byte a code, or Q6_K's K/8 + K/16 (6 bits a code)
  const int64_t in_features = subs ? codes.size(1) * 16 / 3 : codes.size(1) * 4;
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat && rows.dim() == 2 && rows.size(1) == in_features,
                    "int8_rows: float32 rows of ", in_features, ", got ", rows.scalar_type(), " ", rows.sizes());
  const bool layout = codes.is_contiguous() && scales.is_contiguous() && codes.size(0) * 16 == n &&
                      scales.scalar_type() == at::kHalf && (!mins || (mins->is_contiguous() && mins->scalar_type() == at::kHalf)) &&
                      (!subs || (subs->is_contiguous() && subs->scalar_type() == at::kChar));
  TORCH_CHECK_VALUE(layout, "int8_rows: a weight not in the packed layout for ", n, " outputs");
  const at::Tensor x = rows.contiguous();
  at::Tensor y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) > 0) {
    const int status = mohawk_int8_rows_mm(
        as<float>(x), x.size(0), in_features, as<uint32_t>(codes), as<uint16_t>(scales),
        mins ? as<uint16_t>(*mins) : nullptr, subs ? as<int8_t>(*subs) : nullptr, static_cast<int32_t>(offset), n,
        y.mutable_data_ptr<float>(), at::get_num_threads());
    TORCH_CHECK_VALUE(status == 0, "int8_rows: no format has these tables with offset ", offset);
  }
  return y;
}

// x [..., N] / sqrt(mean(x²) + eps) · weight [N], float32.
at::Tensor rms_norm_rows(const at::Tensor& rows, const at::Tensor& weight, double eps) {
  const int64_t width = rows.dim() > 0 ? rows.size(-1) : 0;
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
                    "rms_norm_rows: float32 rows and weight, got ", rows.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == width && weight.is_contiguous(), "rms_norm_rows: weight ",
                    weight.sizes(), " for rows of ", width);
  const at::Tensor x = rows.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t num_rows = width > 0 ? x.numel() / width : 0;
  if (num_rows > 0)
    mohawk_rms_norm_rows(as<float>(x), num_rows, width, as<float>(weight), static_cast<float>(eps),
                         y.mutable_data_ptr<float>(), at::get_num_threads());
  return y;
}

// softmax(q·kᵀ·scale + mask)·v per query: query [B, Q, H, D]; keys/values [KVH, S, D] (a cache's
// pools, or any tensor whose key's D values are contiguous, values strided as keys) read in place,
// key j of sequence b at slot slots[b, j] (int64 [B, L]); mask additive [B, Q, L] (0 or -inf)
// -> [B, Q, H·D].
at::Tensor attend_rows(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                       const at::Tensor& slot_table, const at::Tensor& mask, double scale) {
  TORCH_CHECK_VALUE(query.dim() == 4 && keys.dim() == 3, "attend_rows: query ", query.sizes(), " against keys ",
                    keys.sizes());
  const int64_t batch = query.size(0), num_queries = query.size(1), num_heads = query.size(2),
                head_dim = query.size(3);
  const int64_t kv_heads = keys.size(0), pool = keys.size(1);
  TORCH_CHECK_VALUE(keys.size(2) == head_dim && kv_heads > 0 && num_heads % kv_heads == 0 &&
                        values.sizes() == keys.sizes(),
                    "attend_rows: query ", query.sizes(), " against keys ", keys.sizes());
  const bool half = keys.scalar_type() == at::kHalf;
  TORCH_CHECK_VALUE(query.scalar_type() == at::kFloat && (half || keys.scalar_type() == at::kFloat) &&
                        values.scalar_type() == keys.scalar_type(),
                    "attend_rows: a float32 query, keys and values both float32 or both float16");
  TORCH_CHECK_VALUE(slot_table.scalar_type() == at::kLong && slot_table.dim() == 2 && slot_table.size(0) == batch,
                    "attend_rows: int64 slots [", batch, ", L], got ", slot_table.scalar_type(), " ",
                    slot_table.sizes());
  const int64_t length = slot_table.size(1);
  TORCH_CHECK_VALUE(mask.dim() == 3 && mask.size(0) == batch && mask.size(1) == num_queries && mask.size(2) == length,
                    "attend_rows: mask ", mask.sizes(), ", not [", batch, ", ", num_queries, ", ", length, "]");
  const at::Tensor q = query.contiguous(), m = mask.to(at::kFloat).contiguous(), slots = slot_table.contiguous();
  const int64_t* slot = as<int64_t>(slots);
  for (int64_t i = 0; i < slots.numel(); ++i)
    TORCH_CHECK_VALUE(slot[i] >= 0 && slot[i] < pool, "attend_rows: slot ", slot[i], " outside the pool of ", pool);
  at::Tensor k = keys, v = values;
  if (k.stride(2) != 1 || v.strides() != k.strides()) {
    k = keys.contiguous();
    v = values.contiguous();
  }
  at::Tensor out = at::empty({batch, num_queries, num_heads * head_dim}, q.options());
  if (out.numel() > 0 && half)
    mohawk_attend_rows_f16(as<float>(q), batch, num_queries, num_heads, head_dim, as<uint16_t>(k), as<uint16_t>(v),
                           kv_heads, length, k.stride(0), k.stride(1), slot, as<float>(m), static_cast<float>(scale),
                           out.mutable_data_ptr<float>(), at::get_num_threads());
  else if (out.numel() > 0)
    mohawk_attend_rows(as<float>(q), batch, num_queries, num_heads, head_dim, as<float>(k), as<float>(v), kv_heads,
                       length, k.stride(0), k.stride(1), slot, as<float>(m), static_cast<float>(scale),
                       out.mutable_data_ptr<float>(), at::get_num_threads());
  return out;
}

// int64 [M, k]: the indices of each row's k largest values of x [M, V] (float32), best first,
// ties to the lower index.
at::Tensor top_rows(const at::Tensor& rows, int64_t k) {
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat && rows.dim() == 2, "top_rows: float32 rows [M, V], got ",
                    rows.scalar_type(), " ", rows.sizes());
  TORCH_CHECK_VALUE(k > 0 && k <= rows.size(1), "top_rows: k = ", k, " of rows of ", rows.size(1));
  const at::Tensor x = rows.contiguous();
  at::Tensor out = at::empty({x.size(0), k}, x.options().dtype(at::kLong));
  if (x.size(0) > 0)
    mohawk_top_rows(as<float>(x), x.size(0), x.size(1), k, out.mutable_data_ptr<int64_t>(), at::get_num_threads());
  return out;
}

}  // namespace

extern "C" {

// Registers torch.ops.mohawk.{int4_rows_mm, q4k_rows_mm, int8_rows_mm, rms_norm_rows, attend_rows, top_rows} with this build's kernels;
// once a process (later calls do nothing). Returns 0, or -1 where registration threw.
int mohawk_register_ops() {
  static bool done = false;
  if (done) return 0;
  try {
    auto* ops = new torch::Library(torch::Library::FRAGMENT, "mohawk", std::nullopt, __FILE__, __LINE__);
    ops->def("int4_rows_mm(Tensor x, Tensor codes, Tensor scales, Tensor mins, int n) -> Tensor");
    ops->def("q4k_rows_mm(Tensor x, Tensor codes, Tensor subs, Tensor supers, int n) -> Tensor");
    ops->def(
        "int8_rows_mm(Tensor x, Tensor codes, Tensor scales, Tensor? mins, Tensor? subs, int n, int offset) -> Tensor");
    ops->def("rms_norm_rows(Tensor x, Tensor weight, float eps) -> Tensor");
    ops->def("attend_rows(Tensor query, Tensor keys, Tensor values, Tensor slots, Tensor mask, float scale) -> Tensor");
    ops->def("top_rows(Tensor x, int k) -> Tensor");
    auto* cpu = new torch::Library(torch::Library::IMPL, "mohawk", c10::DispatchKey::CPU, __FILE__, __LINE__);
    cpu->impl("int4_rows_mm", TORCH_FN(int4_rows_mm));
    cpu->impl("q4k_rows_mm", TORCH_FN(q4k_rows_mm));
    cpu->impl("int8_rows_mm", TORCH_FN(int8_rows_mm));
    cpu->impl("rms_norm_rows", TORCH_FN(rms_norm_rows));
    cpu->impl("attend_rows", TORCH_FN(attend_rows));
    cpu->impl("top_rows", TORCH_FN(top_rows));
  } catch (const std::exception&) {
    return -1;
  }
  done = true;
  return 0;
}

}  // extern "C"
