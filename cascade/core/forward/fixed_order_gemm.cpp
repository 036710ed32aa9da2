// A matrix product (float32, or bfloat16 weights and inputs summed in float32) whose every output is one fused multiply-add chain over the inner
// dimension in index order, whatever the number of rows: a row's numbers never depend on the
// other rows of the call (the batch-invariant pass needs that, cascade/core/forward/invariant.py).
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
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>

namespace {

constexpr int64_t kPanel = 16;

// 16 weights of a panel row as two vectors of 8 float32.
inline void load16(const float* p, __m256& low, __m256& high) {
  low = _mm256_loadu_ps(p);
  high = _mm256_loadu_ps(p + 8);
}

inline __m256 widen8(const uint16_t* p) {  // bfloat16 -> float32: the bits shifted up
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

inline void load16(const uint16_t* p, __m256& low, __m256& high) {
  low = widen8(p);
  high = widen8(p + 8);
}

template <int MR, int NP, typename W>
void block(const float* x, int64_t k, const W* w, float* y, int64_t ldy, int64_t cols,
           const float* bias) {
  __m256 acc[MR][NP][2];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p)
      acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    __m256 wv[NP][2];
    _Pragma("GCC unroll 16") for (int p = 0; p < NP; ++p)
      load16(w + (p * k + i) * kPanel, wv[p][0], wv[p][1]);
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

}  // namespace

TORCH_LIBRARY(cascade_fixed_order, m) {
  m.def("linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(cascade_fixed_order, CPU, m) { m.impl("linear", &linear); }
