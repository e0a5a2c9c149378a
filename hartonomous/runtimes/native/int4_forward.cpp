// The int4 runtime's forward in one call: everything between the matmuls in compiled code.
//
// hartonomous/runtimes/int4.py holds the weights and the KV cache and calls `Forward.rows` (decoding,
// extend, extend_tree: one row at a time wherever rows could interact) and `Forward.chunks` (the
// prompt's chunks of batched attention). The matmuls stay torch's: at::_weight_int4pack_mm_for_cpu on
// the packed Q4_1 codes (bitwise the same for 1 row or many), the Q8_0 head as two of them, and, for
// the prompt's chunks, at::linear on the bfloat16 weights and at::scaled_dot_product_attention. The
// norms, the rotary embedding, the row attention over the cache, SiLU and the residuals are the loops
// below: each computes one row (one row and head for attention) alone, in a fixed order of
// operations that depends on nothing but that row's data, so a token's logits are bitwise the same
// decoded alone, in a chain or in a tree, and whatever the thread count.
//
// Determinism: built with -ffp-contract=off, so a product and a sum are fused only where std::fma
// says so, identically at every call site; reductions run in 16 fixed lanes, summed in a fixed tree.
// Cancel: between layers, at most every CANCEL_POLL_MS, the forward asks the Python callable it was
// given (under the GIL, which it otherwise releases) and stops with "cancelled" when it says so.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace py = pybind11;
using at::Tensor;
using bf16 = c10::BFloat16;

namespace {

constexpr int LANES = 16;
constexpr double CANCEL_POLL_MS = 10.0;
constexpr int64_t PARALLEL_KEYS = 4096;   // attention work (keys x heads) below which one thread does it

inline float lane_sum(float* acc) {
  for (int w = LANES / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// bfloat16 <-> float as c10::BFloat16 converts (round to nearest even, NaN to 0x7FC0), branch-free so
// that loops of it vectorise
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : static_cast<uint16_t>(rounded);
}

inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t* bits(Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<bf16>()); }
inline const uint16_t* bits(const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<bf16>()); }

// y = x * rsqrt(mean(x^2) + eps) * w, rounded to bfloat16 (a matmul's input)
void rms_norm_bf16(const float* x, const float* w, int64_t dim, float eps, uint16_t* out) {
  float acc[LANES] = {0};
  for (int64_t d = 0; d < dim; d += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] = std::fma(x[d + l], x[d + l], acc[l]);
  const float r = 1.0f / std::sqrt(lane_sum(acc) / static_cast<float>(dim) + eps);
  for (int64_t d = 0; d < dim; ++d) out[d] = to_bf16((x[d] * r) * w[d]);
}

// ggml's rotation of adjacent pairs: (a, b) -> (a cos - b sin, a sin + b cos)
inline void rotate(float* v, const float* cos_sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1], c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

// 16 floats, loaded and stored unaligned; GCC lowers the operations to AVX-512, AVX2 or SSE as the
// CPU has them, lane by lane (no reassociation: the same bits on any of them)
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));

inline float hsum(v16 v) {   // a fixed tree: 8 + 8, 4 + 4, 2 + 2, 1 + 1
  v = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v = v + __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v = v + __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

inline v16 splat(float x) { return v16{} + x; }

// exp(x) on 16 lanes to ~2 ulp (Cephes' expf polynomial), branch-free
inline v16 exp16(v16 x) {
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.3f ? splat(88.3f) : x;
  const v16 t = x * 1.44269504088896341f + 0.5f;
  v16i i = __builtin_convertvector(t, v16i);                       // truncation, then down to the floor
  i += (v16i)(t < __builtin_convertvector(i, v16));
  const v16 n = __builtin_convertvector(i, v16);
  v16 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  const v16i e = (i + 127) << 23;
  return p * (v16)e;
}

typedef uint32_t v16u __attribute__((vector_size(64), aligned(4)));
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));

inline v16 load_bf16(const uint16_t* p) {
  return (v16)(__builtin_convertvector(*reinterpret_cast<const v16h*>(p), v16u) << 16);
}

inline void store_bf16(uint16_t* p, v16 f) {   // to_bf16 on 16 lanes
  const v16u u = (v16u)f;
  const v16u rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const v16u nan = (v16u)((u & 0x7FFFFFFFu) > 0x7F800000u);
  *reinterpret_cast<v16h*>(p) = __builtin_convertvector((rounded & ~nan) | (nan & 0x7FC0u), v16h);
}

// One query head over the keys it sees (slots idx[0..count), or 0..count when idx is null), ascending;
// NV = head_dim / 16. `scores` has room for count rounded up to 16.
template <int NV>
void attend(const float* q, const float* keys, const float* values, const int32_t* idx, int64_t count, float scale,
            float* scores, float* out) {
  constexpr int64_t hd = NV * 16;
  v16 qv[NV];
  for (int c = 0; c < NV; ++c) qv[c] = *reinterpret_cast<const v16*>(q + 16 * c);
  float top = -INFINITY;
  for (int64_t j = 0; j < count; ++j) {
    const float* k = keys + (idx ? idx[j] : j) * hd;
    v16 acc = qv[0] * *reinterpret_cast<const v16*>(k);
    for (int c = 1; c < NV; ++c) acc = acc + qv[c] * *reinterpret_cast<const v16*>(k + 16 * c);
    const float s = hsum(acc) * scale;
    scores[j] = s;
    top = std::max(top, s);
  }
  v16 total{};
  for (int64_t j = 0; j < count; j += 16) {
    v16 p = exp16(*reinterpret_cast<const v16*>(scores + j) - top);
    if (j + 16 > count)
      for (int l = static_cast<int>(count - j); l < 16; ++l) p[l] = 0.0f;
    *reinterpret_cast<v16*>(scores + j) = p;
    total = total + p;
  }
  const float inv = 1.0f / hsum(total);
  v16 o[NV];
  for (int c = 0; c < NV; ++c) o[c] = v16{};
  for (int64_t j = 0; j < count; ++j) {
    const float* v = values + (idx ? idx[j] : j) * hd;
    const v16 p = splat(scores[j]);
    for (int c = 0; c < NV; ++c) o[c] = o[c] + p * *reinterpret_cast<const v16*>(v + 16 * c);
  }
  for (int c = 0; c < NV; ++c) *reinterpret_cast<v16*>(out + 16 * c) = o[c] * inv;
}

using AttendFn = void (*)(const float*, const float*, const float*, const int32_t*, int64_t, float, float*, float*);

AttendFn attend_for(int64_t hd) {
  switch (hd) {
    case 32: return attend<2>;
    case 64: return attend<4>;
    case 128: return attend<8>;
    default: return nullptr;
  }
}

struct Linear {
  Tensor packed, scales_zeros;
  Tensor operator()(const Tensor& x) const {
    return at::_weight_int4pack_mm_for_cpu(x, packed, 32, scales_zeros);
  }
};

struct Layer {
  Tensor attn_norm, ffn_norm;
  Linear qkv, out, gate_up, down;
};

class Cancelled : public std::exception {
 public:
  const char* what() const noexcept override { return "cancelled"; }
};

class CancelPoll {
 public:
  explicit CancelPoll(py::object check) : check_(std::move(check)), last_(clock::now()) {}
  void operator()() {
    if (check_.is_none()) return;
    const auto now = clock::now();
    if (std::chrono::duration<double, std::milli>(now - last_).count() < CANCEL_POLL_MS) return;
    last_ = now;
    bool stop;
    {
      py::gil_scoped_acquire gil;
      stop = check_().cast<bool>();
    }
    if (stop) throw Cancelled();
  }
 private:
  using clock = std::chrono::steady_clock;
  py::object check_;
  clock::time_point last_;
};

class Forward {
 public:
  Forward(int64_t dim, int64_t hidden, int64_t heads, int64_t kv_heads, double eps, std::vector<Tensor> layers,
          Tensor norm, Tensor head_hi_packed, Tensor head_hi_sz, Tensor head_lo_packed, Tensor head_lo_sz,
          Tensor embed_codes, Tensor embed_scales)
      : dim_(dim), hidden_(hidden), nq_(heads), nkv_(kv_heads), hd_(dim / heads), eps_(static_cast<float>(eps)),
        norm_(norm.contiguous()), head_hi_{head_hi_packed, head_hi_sz}, head_lo_{head_lo_packed, head_lo_sz},
        embed_codes_(embed_codes.contiguous()), embed_scales_(embed_scales.contiguous()) {
    TORCH_CHECK(layers.size() % 10 == 0, "10 tensors a layer");
    attend_ = attend_for(hd_);
    TORCH_CHECK(dim % 32 == 0 && hidden % 16 == 0 && attend_ != nullptr && heads % kv_heads == 0,
                "the native forward needs dim in multiples of 32, hidden of 16 and a head_dim of 32, 64 or 128");
    for (size_t i = 0; i < layers.size(); i += 10)
      layers_.push_back(Layer{layers[i].contiguous(), layers[i + 1].contiguous(), {layers[i + 2], layers[i + 3]},
                              {layers[i + 4], layers[i + 5]}, {layers[i + 6], layers[i + 7]},
                              {layers[i + 8], layers[i + 9]}});
  }

  // Rows fed at cache slots start..start+n, one at a time wherever rows meet (attention); logits of
  // the last `keep` rows. positions: each row's rotary position; allowed: (n, start+n) bool or None
  // (causal); rope: (positions, head_dim/2, 2) cos/sin.
  Tensor rows(const Tensor& ids, const Tensor& keys, const Tensor& values, int64_t start, const Tensor& positions,
              const c10::optional<Tensor>& allowed, const Tensor& rope, int64_t keep, py::object cancel) {
    const int64_t n = ids.size(0);
    TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == at::kFloat,
                "the KV cache must be contiguous float32");
    TORCH_CHECK(start + n <= keys.size(2), "the KV cache has no room for the rows");
    TORCH_CHECK(keep >= 1 && keep <= n, "keep must be between 1 and the rows");
    CancelPoll poll(std::move(cancel));
    std::vector<std::vector<int32_t>> visible(n);
    if (allowed.has_value()) {
      const Tensor mask = allowed->to(at::kBool).contiguous();
      TORCH_CHECK(mask.size(0) == n && mask.size(1) == start + n, "allowed must be (rows, start + rows)");
      const bool* m = mask.data_ptr<bool>();
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < start + n; ++j)
          if (m[r * (start + n) + j]) visible[r].push_back(static_cast<int32_t>(j));
        TORCH_CHECK(!visible[r].empty(), "a row that sees no key");
      }
    }
    py::gil_scoped_release nogil;
    Tensor x = embed(ids);
    const Tensor pos = positions.to(at::kLong).contiguous();
    const Tensor cs = rope.contiguous();
    TORCH_CHECK(pos.size(0) == n && cs.size(1) * 2 == hd_, "positions and rope do not fit the rows");
    const int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) TORCH_CHECK(p[r] >= 0 && p[r] < cs.size(0), "a position beyond the rope table");
    const float* cos_sin = cs.data_ptr<float>();
    const int64_t cap = keys.size(2), half = hd_ / 2;
    const int64_t q_end = nq_ * hd_, k_end = (nq_ + nkv_) * hd_, width = (nq_ + 2 * nkv_) * hd_;
    Tensor xn = at::empty({n, dim_}, at::kBFloat16);
    Tensor attn = at::empty({n, q_end}, at::kBFloat16);
    Tensor act = at::empty({n, hidden_}, at::kBFloat16);
    std::vector<float> qk(n * k_end), heads(n * q_end);
    float* xs = x.data_ptr<float>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    int64_t work = 0;
    for (int64_t r = 0; r < n; ++r) work += allowed.has_value() ? visible[r].size() : start + r + 1;
    work *= nq_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      poll();
      const Layer& L = layers_[i];
      norm_rows(xs, L.attn_norm, n, xn);
      const Tensor qkv = L.qkv(xn);
      const uint16_t* y = bits(qkv);
      float* kc = keys.data_ptr<float>() + i * nkv_ * cap * hd_;
      float* vc = values.data_ptr<float>() + i * nkv_ * cap * hd_;
      for (int64_t r = 0; r < n; ++r) {
        float* row = qk.data() + r * k_end;
        const uint16_t* yr = y + r * width;
        for (int64_t c = 0; c < k_end; ++c) row[c] = from_bf16(yr[c]);
        for (int64_t h = 0; h < nq_ + nkv_; ++h) rotate(row + h * hd_, cos_sin + p[r] * hd_, half);
        for (int64_t g = 0; g < nkv_; ++g) {
          float* kd = kc + (g * cap + start + r) * hd_;
          float* vd = vc + (g * cap + start + r) * hd_;
          std::memcpy(kd, row + q_end + g * hd_, hd_ * sizeof(float));
          for (int64_t d = 0; d < hd_; ++d) vd[d] = from_bf16(yr[k_end + g * hd_ + d]);
        }
      }
      const int64_t rep = nq_ / nkv_;
      auto task = [&](int64_t begin, int64_t end) {
        std::vector<float> scores;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t r = t / nq_, h = t % nq_, g = h / rep;
          const bool masked = allowed.has_value();
          const int64_t count = masked ? static_cast<int64_t>(visible[r].size()) : start + r + 1;
          scores.resize((count + 15) / 16 * 16);
          attend_(qk.data() + r * k_end + h * hd_, kc + g * cap * hd_, vc + g * cap * hd_,
                  masked ? visible[r].data() : nullptr, count, scale, scores.data(), heads.data() + r * q_end + h * hd_);
        }
      };
      if (work < PARALLEL_KEYS) task(0, n * nq_);
      else at::parallel_for(0, n * nq_, 1, task);
      uint16_t* a = bits(attn);
      for (int64_t c = 0; c < n * q_end; ++c) a[c] = to_bf16(heads[c]);
      add_rows(xs, L.out(attn), n, dim_);
      norm_rows(xs, L.ffn_norm, n, xn);
      swiglu(L.gate_up(xn), n, act);
      add_rows(xs, L.down(act), n, dim_);
    }
    return head(xs + (n - keep) * dim_, keep);
  }

  // The prompt's chunks (absolute positions, consecutive from the first chunk's start), layers outer:
  // each chunk's rows attend in one batched call (at::scaled_dot_product_attention, causal over the
  // keys before them and each other), their matmuls run on the bfloat16 weights `dense` (4 a layer).
  // The logits after the last row.
  Tensor chunks(const Tensor& ids, const Tensor& keys, const Tensor& values, const std::vector<int64_t>& cuts,
                const Tensor& rope, const std::vector<Tensor>& dense, py::object cancel) {
    TORCH_CHECK(cuts.size() >= 2 && dense.size() == layers_.size() * 4, "chunks needs cuts and 4 weights a layer");
    const int64_t start = cuts.front(), end = cuts.back(), n = ids.size(0);
    TORCH_CHECK(end - start == n && end <= keys.size(2) && end <= rope.size(0), "the chunks do not fit the rows");
    CancelPoll poll(std::move(cancel));
    py::gil_scoped_release nogil;
    Tensor x = embed(ids);
    float* xs = x.data_ptr<float>();
    const Tensor cs = rope.contiguous();
    const float* cos_sin = cs.data_ptr<float>();
    const int64_t cap = keys.size(2), half = hd_ / 2;
    const int64_t q_end = nq_ * hd_, k_end = (nq_ + nkv_) * hd_;
    std::vector<Tensor> masks;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t s = cuts[c], e = cuts[c + 1];
      masks.push_back(at::arange(e).unsqueeze(0).le(at::arange(s, e).unsqueeze(1)));
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      const Tensor &w_qkv = dense[4 * i], &w_out = dense[4 * i + 1], &w_gu = dense[4 * i + 2], &w_down = dense[4 * i + 3];
      const Tensor kl = keys.select(0, i), vl = values.select(0, i);
      float* kc = kl.data_ptr<float>();
      float* vc = vl.data_ptr<float>();
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        poll();
        const int64_t s = cuts[c], e = cuts[c + 1], m = e - s;
        float* xc = xs + (s - start) * dim_;
        Tensor xn = at::empty({m, dim_}, at::kBFloat16);
        norm_rows(xc, L.attn_norm, m, xn);
        const Tensor qkv = at::linear(xn, w_qkv);
        const uint16_t* y = bits(qkv);
        const int64_t width = qkv.size(1);
        Tensor q = at::empty({1, nq_, m, hd_}, at::kFloat);
        float* qd = q.data_ptr<float>();
        std::vector<float> row(k_end);
        for (int64_t r = 0; r < m; ++r) {
          const uint16_t* yr = y + r * width;
          for (int64_t c2 = 0; c2 < k_end; ++c2) row[c2] = from_bf16(yr[c2]);
          for (int64_t h = 0; h < nq_ + nkv_; ++h) rotate(row.data() + h * hd_, cos_sin + (s + r) * hd_, half);
          for (int64_t h = 0; h < nq_; ++h) std::memcpy(qd + (h * m + r) * hd_, row.data() + h * hd_, hd_ * sizeof(float));
          for (int64_t g = 0; g < nkv_; ++g) {
            std::memcpy(kc + (g * cap + s + r) * hd_, row.data() + q_end + g * hd_, hd_ * sizeof(float));
            float* vd = vc + (g * cap + s + r) * hd_;
            for (int64_t d = 0; d < hd_; ++d) vd[d] = from_bf16(yr[k_end + g * hd_ + d]);
          }
        }
        // contiguous: the same bits whatever the cache's capacity
        const Tensor kk = kl.narrow(1, 0, e).contiguous().unsqueeze(0), vv = vl.narrow(1, 0, e).contiguous().unsqueeze(0);
        const Tensor out = at::scaled_dot_product_attention(q, kk, vv, masks[c], 0.0, false, c10::nullopt, true);
        const Tensor a = out.select(0, 0).transpose(0, 1).reshape({m, q_end}).to(at::kBFloat16);
        add_rows(xc, at::linear(a, w_out), m, dim_);
        norm_rows(xc, L.ffn_norm, m, xn);
        Tensor act = at::empty({m, hidden_}, at::kBFloat16);
        swiglu(at::linear(xn, w_gu), m, act);
        add_rows(xc, at::linear(act, w_down), m, dim_);
      }
    }
    return head(xs + (n - 1) * dim_, 1).select(0, 0);
  }

 private:
  Tensor embed(const Tensor& ids) const {
    const Tensor t = ids.to(at::kLong).contiguous();
    const int64_t n = t.size(0), vocab = embed_codes_.size(0), blocks = dim_ / 32;
    Tensor x = at::empty({n, dim_}, at::kFloat);
    const int64_t* id = t.data_ptr<int64_t>();
    const int8_t* codes = embed_codes_.data_ptr<int8_t>();
    const float* sc = embed_scales_.data_ptr<float>();
    float* out = x.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      TORCH_CHECK(id[r] >= 0 && id[r] < vocab, "a token id outside the vocabulary");
      for (int64_t d = 0; d < dim_; ++d)
        out[r * dim_ + d] = static_cast<float>(codes[id[r] * dim_ + d]) * sc[id[r] * blocks + d / 32];
    }
    return x;
  }

  void norm_rows(const float* x, const Tensor& w, int64_t n, Tensor& out) const {
    uint16_t* o = bits(out);
    const float* wd = w.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) rms_norm_bf16(x + r * dim_, wd, dim_, eps_, o + r * dim_);
  }

  static void add_rows(float* x, const Tensor& y, int64_t n, int64_t dim) {
    const Tensor yc = y.contiguous();
    const uint16_t* v = bits(yc);
    for (int64_t c = 0; c < n * dim; ++c) x[c] += from_bf16(v[c]);
  }

  // silu(gate) * up as torch computes it on bfloat16 tensors: each result rounded to bfloat16
  void swiglu(const Tensor& gate_up, int64_t n, Tensor& out) const {
    const Tensor gu = gate_up.contiguous();
    const uint16_t* g = bits(gu);
    uint16_t* o = bits(out);
    for (int64_t r = 0; r < n; ++r) {
      const uint16_t* gr = g + r * 2 * hidden_;
      uint16_t* orow = o + r * hidden_;
      for (int64_t c = 0; c < hidden_; c += 16) {
        const v16 a = load_bf16(gr + c);
        store_bf16(orow + c, a / (1.0f + exp16(-a)));                  // silu(gate), rounded to bfloat16
        store_bf16(orow + c, load_bf16(orow + c) * load_bf16(gr + hidden_ + c));
      }
    }
  }

  Tensor head(const float* x, int64_t rows) const {
    Tensor xn = at::empty({rows, dim_}, at::kBFloat16);
    norm_rows(x, norm_, rows, xn);
    const Tensor hi = head_hi_(xn), lo = head_lo_(xn);
    Tensor logits = at::empty({rows, hi.size(1)}, at::kFloat);
    const uint16_t* a = bits(hi);
    const uint16_t* b = bits(lo);
    float* o = logits.data_ptr<float>();
    for (int64_t c = 0; c < logits.numel(); ++c) o[c] = from_bf16(a[c]) + from_bf16(b[c]);
    return logits;
  }

  int64_t dim_, hidden_, nq_, nkv_, hd_;
  float eps_;
  AttendFn attend_;
  Tensor norm_;
  Linear head_hi_, head_lo_;
  Tensor embed_codes_, embed_scales_;
  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::register_exception<Cancelled>(m, "Cancelled");
  py::class_<Forward>(m, "Forward")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double, std::vector<Tensor>, Tensor, Tensor, Tensor, Tensor,
                    Tensor, Tensor, Tensor>())
      .def("rows", &Forward::rows)
      .def("chunks", &Forward::chunks);
}
