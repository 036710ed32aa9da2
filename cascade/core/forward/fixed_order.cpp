// A matrix product (float32, or bfloat16 weights and inputs summed in float32) whose every
// output is one fused multiply-add chain over the inner dimension in index order, whatever the
// number of rows: a row's numbers never depend on the other rows of the call (the
// batch-invariant pass needs that, cascade/core/forward/invariant.py).
// AVX2 + FMA; built and loaded by cascade/core/forward/fixed_order.py. A bfloat16 product reads
// half the weight bytes (widened to float32 in registers) and rounds each output once.
//
// The weight [out, in] is packed into panels of 16 output columns, [ceil(out / 16), in, 16],
// so a panel streams contiguously. Registers hold MR rows x NP panels of accumulators (at most
// 12 of 16 ymm registers): few rows take several panels at once (the loads of one row's chains
// overlap), many rows one panel (each weight load feeds six rows). Blocking changes which
// outputs are computed together, never the order of any output's sum.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kPanel = 16;

// 8 (or one) float32 or bfloat16 values as float32; a bfloat16 is the high half of a float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return c10::detail::f32_from_bits(*p); }

template <int MR, int NP, typename W>
void block(const float* x, int64_t k, const W* w, float* y, int64_t ldy, int64_t cols,
           const float* bias) {
  __m256 acc[MR][NP][2];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p)
      acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    __m256 wv[NP][2];
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p) {
      wv[p][0] = load8(w + (p * k + i) * kPanel);
      wv[p][1] = load8(w + (p * k + i) * kPanel + 8);
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      __m256 xv = _mm256_broadcast_ss(x + r * k + i);
      _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p) {
        acc[r][p][0] = _mm256_fmadd_ps(xv, wv[p][0], acc[r][p][0]);
        acc[r][p][1] = _mm256_fmadd_ps(xv, wv[p][1], acc[r][p][1]);
      }
    }
  }
  alignas(32) float out[kPanel];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p) {
      _mm256_store_ps(out, acc[r][p][0]);
      _mm256_store_ps(out + 8, acc[r][p][1]);
      const int64_t base = p * kPanel;
      for (int64_t c = 0; c < kPanel && base + c < cols; ++c)
        y[r * ldy + base + c] = bias ? out[c] + bias[base + c] : out[c];
    }
}

// All m rows against NP panels: blocks of MR rows, then the remaining rows in one block.
template <int NP, typename W>
void panels(const float* x, int64_t m, int64_t k, const W* w, float* y, int64_t ldy,
            int64_t cols, const float* bias) {
  constexpr int MR = std::min(6, 12 / (2 * NP));
  int64_t r = 0;
  for (; r + MR <= m; r += MR) block<MR, NP, W>(x + r * k, k, w, y + r * ldy, ldy, cols, bias);
  const float* xr = x + r * k;
  float* yr = y + r * ldy;
  switch (m - r) {
    case 0: break;
    case 1: block<1, NP, W>(xr, k, w, yr, ldy, cols, bias); break;
    case 2: block<std::min(2, MR), NP, W>(xr, k, w, yr, ldy, cols, bias); break;
    case 3: block<std::min(3, MR), NP, W>(xr, k, w, yr, ldy, cols, bias); break;
    case 4: block<std::min(4, MR), NP, W>(xr, k, w, yr, ldy, cols, bias); break;
    default: block<std::min(5, MR), NP, W>(xr, k, w, yr, ldy, cols, bias); break;
  }
}

int panels_at_once(int64_t rows) { return rows <= 1 ? 4 : rows == 2 ? 3 : rows == 3 ? 2 : 1; }

template <typename W>
void multiply(const float* x, int64_t m, int64_t k, const W* w, int64_t count, float* y,
              int64_t out_features, const float* bias) {
  const int np = panels_at_once(m);
  const int64_t groups = (count + np - 1) / np;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * np, col = first * kPanel, cols = out_features - col;
      const W* gw = w + first * k * kPanel;
      const float* gb = bias ? bias + col : nullptr;
      switch (std::min<int64_t>(np, count - first)) {
        case 4: panels<4, W>(x, m, k, gw, y + col, out_features, cols, gb); break;
        case 3: panels<3, W>(x, m, k, gw, y + col, out_features, cols, gb); break;
        case 2: panels<2, W>(x, m, k, gw, y + col, out_features, cols, gb); break;
        default: panels<1, W>(x, m, k, gw, y + col, out_features, cols, gb); break;
      }
    }
  });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                  const std::optional<at::Tensor>& bias) {
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "fixed-order products take float32 or bfloat16 weights, got ", dtype);
  TORCH_CHECK(x.scalar_type() == dtype, "the input is ", x.scalar_type(), ", the weight ", dtype);
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous(),
              "the weight must be packed by cascade.core.forward.fixed_order.pack");
  const int64_t k = packed.size(1), count = packed.size(0);
  TORCH_CHECK(x.size(-1) == k, "the input has ", x.size(-1), " features, the weight ", k);
  TORCH_CHECK(out_features > (count - 1) * kPanel && out_features <= count * kPanel,
              "out_features ", out_features, " does not match ", count, " panels");
  TORCH_CHECK(!bias.has_value() || bias->numel() == out_features,
              "the bias must have ", out_features, " values");
  const at::Tensor rows = x.reshape({-1, k}).to(at::kFloat).contiguous();
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t m = rows.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out_features;
  at::Tensor y = at::empty({m, out_features}, x.options().dtype(at::kFloat));
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  if (m > 0 && dtype == at::kFloat)
    multiply(rows.data_ptr<float>(), m, k, packed.data_ptr<float>(), count,
             y.data_ptr<float>(), out_features, bp);
  else if (m > 0)
    multiply(rows.data_ptr<float>(), m, k,
             reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), count,
             y.data_ptr<float>(), out_features, bp);
  return y.to(dtype).view(shape);
}

// ---- Attention: each query over the key slots of its group, in slot order -------------------
// A query's scores, softmax and weighted sum of values run over its visible keys alone, in the
// order of its group's slots, with no blocking by the key count: the result depends on those
// keys and nothing else (not the other queries, not masked or padding keys), so the pass needs
// neither fixed key spans padded alike nor a probe of a library's products.


// Eight dot products q . k[c], each by the same operations whatever the others are: an 8-lane
// FMA chain over the dimension, its lanes summed by one fixed tree, the remainder in order.
inline __m128 lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

template <typename KV>
void dot8(const float* q, const KV* const k[8], int64_t d, float* out) {
  __m256 a[8];
  for (int c = 0; c < 8; ++c) a[c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; ++c)
      a[c] = _mm256_fmadd_ps(qv, load8(k[c] + i), a[c]);
  }
  _mm_storeu_ps(out, lanes4(a[0], a[1], a[2], a[3]));
  _mm_storeu_ps(out + 4, lanes4(a[4], a[5], a[6], a[7]));
  for (; i < d; ++i)
    for (int c = 0; c < 8; ++c) out[c] = std::fma(q[i], load1(k[c] + i), out[c]);
}

// exp of 8 values (x <= 0 here; below -87 it gives the smallest normal, not 0), a fixed
// polynomial: the same bits for the same input, whatever the neighbouring lanes hold.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i scale = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

// out[0:d] = sum over n of w[n] * v[n][0:d], each lane summed over n in order (32 lanes at a
// time: four independent chains).
template <typename KV>
void weighted_sum(float* out, const float* w, const KV* const* v, int64_t count, int64_t d) {
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t n = 0; n < count; ++n) {
      const __m256 wv = _mm256_set1_ps(w[n]);
      a0 = _mm256_fmadd_ps(wv, load8(v[n] + i), a0);
      a1 = _mm256_fmadd_ps(wv, load8(v[n] + i + 8), a1);
      a2 = _mm256_fmadd_ps(wv, load8(v[n] + i + 16), a2);
      a3 = _mm256_fmadd_ps(wv, load8(v[n] + i + 24), a3);
    }
    _mm256_storeu_ps(out + i, a0);
    _mm256_storeu_ps(out + i + 8, a1);
    _mm256_storeu_ps(out + i + 16, a2);
    _mm256_storeu_ps(out + i + 24, a3);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t n = 0; n < count; ++n)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[n]), load8(v[n] + i), acc);
    _mm256_storeu_ps(out + i, acc);
  }
  for (; i < d; ++i) {
    float acc = 0;
    for (int64_t n = 0; n < count; ++n) acc = std::fma(w[n], load1(v[n] + i), acc);
    out[i] = acc;
  }
}

struct AttentionPlan {
  const int64_t *slots, *group_start, *query_rows, *query_group, *mask_start;
  const bool* mask;
  int64_t groups;  // query heads per kv head
  float scaling, softcap;
};

template <typename KV>
struct Scratch {
  std::vector<const KV*> k, v;
  std::vector<float> scores;
};

// One query row and kv head: its `groups` query heads over the group's visible slots.
template <typename KV>
void attend_one(const AttentionPlan& plan, int64_t r, int64_t kv_head, const float* query,
                int64_t heads_stride, int64_t row_stride, const KV* keys, const KV* values,
                int64_t kv_head_stride, int64_t slot_stride, int64_t d, float* out,
                Scratch<KV>& scratch) {
  const int64_t g = plan.query_group[r], first = plan.group_start[g];
  const int64_t span = plan.group_start[g + 1] - first, row = plan.query_rows[r];
  const bool* visible = plan.mask + plan.mask_start[r];
  scratch.k.clear();
  scratch.v.clear();
  for (int64_t j = 0; j < span; ++j)
    if (visible[j]) {
      const int64_t at = kv_head * kv_head_stride + plan.slots[first + j] * slot_stride;
      scratch.k.push_back(keys + at);
      scratch.v.push_back(values + at);
    }
  const int64_t count = static_cast<int64_t>(scratch.k.size());
  if (count == 0) return;
  while (scratch.k.size() % 8) scratch.k.push_back(scratch.k.back());  // whole batches
  scratch.scores.resize(scratch.k.size());
  float* s = scratch.scores.data();
  for (int64_t i = 0; i < plan.groups; ++i) {
    const int64_t head = kv_head * plan.groups + i;
    const float* q = query + head * heads_stride + row * row_stride;
    for (size_t n = 0; n < scratch.k.size(); n += 8) dot8(q, &scratch.k[n], d, s + n);
    float top = -INFINITY;
    for (int64_t n = 0; n < count; ++n) {
      s[n] *= plan.scaling;
      if (plan.softcap > 0) s[n] = std::tanh(s[n] / plan.softcap) * plan.softcap;
      top = std::max(top, s[n]);
    }
    const __m256 shift = _mm256_set1_ps(top);
    for (size_t n = 0; n < scratch.k.size(); n += 8)
      _mm256_storeu_ps(s + n, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + n), shift)));
    float total = 0;
    for (int64_t n = 0; n < count; ++n) total += s[n];
    for (int64_t n = 0; n < count; ++n) s[n] /= total;
    weighted_sum(out + head * heads_stride + row * row_stride, s, scratch.v.data(), count, d);
  }
}

at::Tensor attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                     const at::Tensor& slots, const at::Tensor& group_start,
                     const at::Tensor& query_rows, const at::Tensor& query_group,
                     const at::Tensor& mask, const at::Tensor& mask_start, double scaling,
                     std::optional<double> softcap) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && query.dim() == 3 && query.is_contiguous(),
              "the query must be contiguous float32 [heads, rows, dim]");
  TORCH_CHECK(keys.scalar_type() == values.scalar_type() && keys.sizes() == values.sizes() &&
                  keys.strides() == values.strides() && keys.dim() == 3 && keys.stride(2) == 1,
              "keys and values must be alike [kv_heads, slots, dim] with contiguous rows");
  TORCH_CHECK(keys.scalar_type() == at::kFloat || keys.scalar_type() == at::kBFloat16,
              "keys and values must be float32 or bfloat16");
  const int64_t heads = query.size(0), d = query.size(2), kv_heads = keys.size(0);
  TORCH_CHECK(keys.size(2) == d && heads % kv_heads == 0, "query and keys do not match");
  const at::Tensor planned[] = {slots, group_start, query_rows, query_group, mask_start};
  for (const auto& t : planned)
    TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous(), "plan tensors are int64");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous(), "the mask is bool");
  AttentionPlan plan{slots.data_ptr<int64_t>(), group_start.data_ptr<int64_t>(),
                     query_rows.data_ptr<int64_t>(), query_group.data_ptr<int64_t>(),
                     mask_start.data_ptr<int64_t>(), mask.data_ptr<bool>(), heads / kv_heads,
                     static_cast<float>(scaling), static_cast<float>(softcap.value_or(0.0))};
  at::Tensor out = at::zeros_like(query);
  const int64_t count = query_rows.numel();
  const float* q = query.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, count * kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch<float> full;
    Scratch<uint16_t> half;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / kv_heads, h = item % kv_heads;
      if (keys.scalar_type() == at::kFloat)
        attend_one(plan, r, h, q, query.stride(0), d, keys.data_ptr<float>(),
                   values.data_ptr<float>(), keys.stride(0), keys.stride(1), d, o, full);
      else
        attend_one(plan, r, h, q, query.stride(0), d,
                   reinterpret_cast<const uint16_t*>(keys.data_ptr<at::BFloat16>()),
                   reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>()),
                   keys.stride(0), keys.stride(1), d, o, half);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(cascade_fixed_order, m) {
  m.def("linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
  m.def("attention(Tensor query, Tensor keys, Tensor values, Tensor slots, Tensor group_start, "
        "Tensor query_rows, Tensor query_group, Tensor mask, Tensor mask_start, float scaling, "
        "float? softcap) -> Tensor");
}

TORCH_LIBRARY_IMPL(cascade_fixed_order, CPU, m) {
  m.impl("linear", &linear);
  m.impl("attention", &attention);
}
